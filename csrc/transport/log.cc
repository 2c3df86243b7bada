#include "transport/log.h"

#include <chrono>
#include <cstdio>
#include <mutex>

namespace tgpg {

void log_warning(const std::string& message) {
  std::fprintf(stderr, "[torch_grpc_pg] warning: %s\n", message.c_str());
  std::fflush(stderr);
}

void log_warning_limited(const std::string& message) {
  using Clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static Clock::time_point last{};
  static unsigned long left_out = 0;
  unsigned long before = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = Clock::now();
    if (last != Clock::time_point{} && now - last < std::chrono::seconds(1)) {
      ++left_out;
      return;
    }
    last = now;
    before = left_out;
    left_out = 0;
  }
  log_warning(before == 0 ? message
                          : message + " (" + std::to_string(before) + " similar events in the second before were "
                            "not logged)");
}

}  // namespace tgpg
