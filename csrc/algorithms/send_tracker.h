#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

namespace tgpg {

// Counts payloads handed to the transport without a copy and not yet released
// by it. A collective may only complete, and its caller reuse the tensor, once
// every payload is released. `keepalive` owns the memory being sent, so that
// even a collective that fails early can never let the transport read freed memory.
class SendTracker {
 public:
  explicit SendTracker(std::shared_ptr<void> keepalive) : keepalive_(std::move(keepalive)) {}

  void acquire();
  void release();
  // False if payloads are still held by the transport at the deadline.
  bool wait_released(std::chrono::steady_clock::time_point deadline);

 private:
  std::shared_ptr<void> keepalive_;
  std::mutex mutex_;
  std::condition_variable released_;
  size_t outstanding_ = 0;
};

}  // namespace tgpg
