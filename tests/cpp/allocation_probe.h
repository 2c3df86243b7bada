#pragma once

#include <cstddef>

namespace tgpg_test {

// Records the largest single operator new request made while a probe exists.
// Linking allocation_probe.cc replaces the global operator new of the binary.
class AllocationProbe {
 public:
  AllocationProbe();
  ~AllocationProbe();
  AllocationProbe(const AllocationProbe&) = delete;
  AllocationProbe& operator=(const AllocationProbe&) = delete;

  size_t largest() const;
};

}  // namespace tgpg_test
