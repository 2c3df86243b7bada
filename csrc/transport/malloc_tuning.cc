#include "transport/malloc_tuning.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace tgpg {
namespace {

#ifdef __GLIBC__
constexpr int kMmapThresholdBytes = 32 << 20;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
constexpr int kTrimThresholdBytes = 64 << 20;  // twice that, as glibc's dynamic rule sets it

bool user_configured_malloc() {
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr;
}
#endif

}  // namespace

void keep_freed_memory_for_reuse() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    if (user_configured_malloc()) return;
    mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
    mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes);
  });
#endif
}

}  // namespace tgpg
