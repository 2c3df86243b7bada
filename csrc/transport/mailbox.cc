#include "transport/mailbox.h"

#include "algorithms/collective_error.h"

namespace tgpg {

Mailbox::Mailbox(int rank, int world, size_t max_queued_frames, size_t max_queued_bytes)
    : rank_(rank),
      max_queued_(std::max<size_t>(1, max_queued_frames)),
      max_queued_bytes_(std::max<size_t>(1, max_queued_bytes)),
      sources_(world) {}

void Mailbox::on_first_failure(std::function<void(const std::string&)> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_first_failure_ = std::move(hook);
}

bool Mailbox::deliver(int src, ReceivedFrame frame, const std::shared_ptr<ReadGate>& gate) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_) return true;
  Source& source = sources_.at(src);
  // Nothing speaks for a source after its stream ended: its place in the
  // group is never given to another stream (RankServer::attach), and a frame
  // that still came would be taken as the next of a message it is not part of.
  if (source.closed) return true;
  source.bytes += frame.payload_bytes();
  source.frames.push_back(std::move(frame));
  arrived_.notify_all();
  // The stream reads one message at a time, so pausing here admits nothing more.
  if (source.frames.size() < max_queued_ && source.bytes < max_queued_bytes_) return true;
  source.paused = gate;
  return false;
}

void Mailbox::close_source(int src, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  Source& source = sources_.at(src);
  if (source.closed) return;
  source.closed = true;
  source.closed_reason = reason;
  source.paused.reset();
  arrived_.notify_all();
}

void Mailbox::fail(const std::string& reason) {
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = reason.empty() ? "unknown failure" : reason;
    arrived_.notify_all();
    if (!shut_down_) hook = std::move(on_first_failure_);
    on_first_failure_ = nullptr;
    hook_running_ = static_cast<bool>(hook);
  }
  if (!hook) return;
  hook(reason.empty() ? "unknown failure" : reason);
  std::lock_guard<std::mutex> lock(mutex_);
  hook_running_ = false;
  arrived_.notify_all();
}

void Mailbox::shut_down() {
  std::vector<std::shared_ptr<ReadGate>> paused;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    arrived_.wait(lock, [&] { return !hook_running_; });
    shut_down_ = true;
    if (failure_.empty()) failure_ = "the process group was destroyed";
    on_first_failure_ = nullptr;
    for (Source& source : sources_) {
      source.frames.clear();
      source.bytes = 0;
      if (source.paused) paused.push_back(std::move(source.paused));
    }
    arrived_.notify_all();
  }
  // Paused streams must read on, to drain and see their end.
  for (auto& gate : paused) gate->resume();
}

ReceivedFrame Mailbox::take(int src, Deadline deadline) {
  std::shared_ptr<ReadGate> to_resume;
  ReceivedFrame frame;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    Source& source = sources_.at(src);
    const bool ready = arrived_.wait_until(lock, deadline, [&] {
      return !failure_.empty() || !source.frames.empty() || source.closed;
    });
    if (!failure_.empty()) throw CollectiveError(failure_);
    if (!ready) throw PeerTimeout("timed out");
    if (source.frames.empty()) throw CollectiveError(source.closed_reason);
    frame = std::move(source.frames.front());
    source.frames.pop_front();
    source.bytes -= frame.payload_bytes();
    // Resume at half capacity rather than at once, so a stream is not paused
    // and resumed for every frame.
    if (source.paused && source.frames.size() <= max_queued_ / 2 && source.bytes <= max_queued_bytes_ / 2) {
      to_resume = std::move(source.paused);
    }
  }
  if (to_resume) to_resume->resume();
  return frame;
}

int Mailbox::wait_any(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  int found = -1;
  const bool ready = arrived_.wait_until(lock, deadline, [&] {
    if (!failure_.empty()) return true;
    for (size_t i = 0; i < sources_.size(); ++i) {
      const size_t src = (next_any_ + i) % sources_.size();
      if (!sources_[src].frames.empty()) {
        found = static_cast<int>(src);
        return true;
      }
    }
    return false;
  });
  if (!failure_.empty()) throw CollectiveError(failure_);
  if (!ready) throw PeerTimeout("timed out");
  next_any_ = (static_cast<size_t>(found) + 1) % sources_.size();
  return found;
}

bool Mailbox::has_frame(int src) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !sources_.at(src).frames.empty();
}

bool Mailbox::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !failure_.empty();
}

std::string Mailbox::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

}  // namespace tgpg
