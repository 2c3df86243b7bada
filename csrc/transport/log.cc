#include "transport/log.h"

#include <cstdio>

namespace tgpg {

void log_warning(const std::string& message) {
  std::fprintf(stderr, "[torch_grpc_pg] warning: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace tgpg
