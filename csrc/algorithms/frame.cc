#include "algorithms/frame.h"

#include <cstring>

#include "algorithms/send_tracker.h"

namespace tgpg {

size_t ReceivedFrame::payload_bytes() const {
  size_t total = 0;
  for (const auto& view : payload) total += view.size;
  return total;
}

void ReceivedFrame::copy_payload_to(void* dst) const {
  copy_payload_to(dst, [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); });
}

void ReceivedFrame::copy_payload_to(void* dst, CopyFn copy) const {
  auto* out = static_cast<std::byte*>(dst);
  for (const auto& view : payload) {
    copy(out, view.data, view.size);
    out += view.size;
  }
}

void SendTracker::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++outstanding_;
}

void SendTracker::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (--outstanding_ == 0) released_.notify_all();
}

bool SendTracker::wait_released(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return released_.wait_until(lock, deadline, [&] { return outstanding_ == 0; });
}

}  // namespace tgpg
