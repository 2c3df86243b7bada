#include "allocation_probe.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace tgpg_test {
namespace {

std::atomic<int> probes{0};
std::atomic<size_t> largest_request{0};

void* allocate(size_t size) {
  if (probes.load(std::memory_order_relaxed) > 0) {
    size_t seen = largest_request.load(std::memory_order_relaxed);
    while (size > seen && !largest_request.compare_exchange_weak(seen, size)) {
    }
  }
  // Through malloc, so that sanitizers still watch every block.
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

}  // namespace

AllocationProbe::AllocationProbe() {
  largest_request = 0;
  ++probes;
}

AllocationProbe::~AllocationProbe() { --probes; }

size_t AllocationProbe::largest() const { return largest_request.load(); }

}  // namespace tgpg_test

void* operator new(size_t size) { return tgpg_test::allocate(size); }
void* operator new[](size_t size) { return tgpg_test::allocate(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
