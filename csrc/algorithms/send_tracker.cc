#include "algorithms/send_tracker.h"

namespace tgpg {

void SendTracker::hold(std::shared_ptr<const void> memory) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.push_back(std::move(memory));
}

void SendTracker::acquire(int dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto peer = static_cast<size_t>(dst);
  if (peer >= outstanding_by_peer_.size()) outstanding_by_peer_.resize(peer + 1, 0);
  ++outstanding_by_peer_[peer];
  ++outstanding_;
}

void SendTracker::release(int dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  --outstanding_by_peer_.at(static_cast<size_t>(dst));
  if (--outstanding_ == 0) changed_.notify_all();
}

void SendTracker::abandon(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!abandoned_.empty()) return;
  abandoned_ = reason.empty() ? "the transport failed" : reason;
  changed_.notify_all();
}

SendTracker::Outcome SendTracker::wait_released(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  Outcome outcome;
  outcome.released =
      changed_.wait_until(lock, deadline, [&] { return outstanding_ == 0 || !abandoned_.empty(); }) &&
      outstanding_ == 0;
  if (outcome.released) return outcome;
  outcome.abandoned = abandoned_;
  for (size_t peer = 0; peer < outstanding_by_peer_.size(); ++peer) {
    if (outstanding_by_peer_[peer] > 0) outcome.holding.push_back(static_cast<int>(peer));
  }
  return outcome;
}

}  // namespace tgpg
