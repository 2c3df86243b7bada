#include "transport/ring_writer.h"

#include <utility>

#include "transport/thread_name.h"
#include "transport/wire_format.h"

namespace tgpg {
namespace {

void release_payload(std::function<void()>& release) {
  if (release) std::exchange(release, nullptr)();
}

}  // namespace

RingWriter::RingWriter(std::unique_ptr<SendRing> ring, FrameStream& stream, SentCounter count_sent)
    : ring_(std::move(ring)), stream_(stream), count_sent_(std::move(count_sent)), thread_([this] { run(); }) {
  // A stream that ends while the thread sleeps for room (the peer went away)
  // must end the sleep, which nothing else would: the receiver gives no room back.
  stream_.notify_end([ring = ring_.get()] { ring->interrupt(); });
}

RingWriter::~RingWriter() {
  // A deadline already past: whatever is still queued is dropped at once.
  wait_closed(Clock::now());
  stream_.notify_end(nullptr);
}

bool RingWriter::needs_slot(ByteView payload) const {
  // The mapping only ever goes from absent to present, so a frame judged
  // before it is sent the old way, which is still allowed before the switch.
  return payload.size > kMaxRecordBytes && ring_->attached();
}

bool RingWriter::wait_for_room(uint32_t seen) {
  if (stream_.ended()) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (give_up_) return false;
  }
  ring_->wait_for_release(seen);
  return true;
}

RingWriter::Outcome RingWriter::given_up() const { return stream_.ended() ? Outcome::Broken : Outcome::Dropped; }

bool RingWriter::send(const FrameHeader& header, ByteView payload, std::function<void()> release) {
  std::deque<Pending> dropped;
  std::unique_lock<std::mutex> lock(mutex_);
  if (closing_ || broken_) {
    lock.unlock();
    release_payload(release);
    return false;
  }
  if (header.kind == FrameKind::Abort) {
    give_up_ = true;
    dropped.swap(queue_);
    ring_->interrupt();
  }
  Pending item{header, payload, std::move(release)};
  Outcome outcome = Outcome::WouldWait;
  if (busy_ || !queue_.empty() || needs_slot(payload)) {
    queue_.push_back(std::move(item));
  } else {
    // Nothing before it and no slot to wait for: sent now, on this thread,
    // with no hand-off, so small messages keep their latency.
    busy_ = true;
    lock.unlock();
    for (auto& d : std::exchange(dropped, {})) release_payload(d.release);
    outcome = transmit(item, /*may_wait=*/false);
    lock.lock();
    busy_ = false;
    broken_ = broken_ || outcome == Outcome::Broken;
    // Whatever came meanwhile queued behind it, so one that must wait for a record goes first.
    if (outcome == Outcome::WouldWait) queue_.push_front(std::move(item));
  }
  lock.unlock();
  cv_.notify_all();
  for (auto& d : dropped) release_payload(d.release);
  return outcome != Outcome::Broken;
}

RingWriter::Outcome RingWriter::post_record(const std::string& record, bool may_wait) {
  for (;;) {
    const uint32_t seen = ring_->releases();
    if (ring_->post(record)) return Outcome::Sent;
    if (!may_wait) return Outcome::WouldWait;
    if (!wait_for_room(seen)) return given_up();
  }
}

RingWriter::Outcome RingWriter::transmit(Pending& item, bool may_wait) {
  if (item.header.kind == FrameKind::Abort || (!switched_ && !ring_->attached())) {
    count_sent_(item.payload.size, /*through_ring=*/false);
    return stream_.write(encode_frame(item.header, item.payload, std::move(item.release))) ? Outcome::Sent
                                                                                           : Outcome::Broken;
  }
  if (!switched_) {
    // The receiver reads records only after this, so none overtakes a frame
    // written on the stream before it.
    if (!stream_.write(encode_ring_switch())) {
      release_payload(item.release);
      return Outcome::Broken;
    }
    switched_ = true;
  }
  if (item.payload.size <= kMaxRecordBytes) {
    const std::string record = encode_frame_record(item.header, item.payload);
    if (record.size() <= kMaxRecordBytes) {
      const Outcome outcome = post_record(record, may_wait);
      if (outcome == Outcome::WouldWait) return outcome;
      release_payload(item.release);
      if (outcome == Outcome::Sent) count_sent_(item.payload.size, /*through_ring=*/true);
      return outcome;
    }
  }
  if (!may_wait) return Outcome::WouldWait;
  for (;;) {
    const uint32_t seen = ring_->releases();
    if (std::optional<RingSlot> slot = ring_->put(item.payload)) {
      release_payload(item.release);
      const Outcome outcome = post_record(encode_ring_frame(item.header, *slot), /*may_wait=*/true);
      if (outcome == Outcome::Sent) count_sent_(item.payload.size, /*through_ring=*/true);
      return outcome;
    }
    if (!wait_for_room(seen)) {
      release_payload(item.release);
      return given_up();
    }
  }
}

void RingWriter::run() {
  name_this_thread("tgpg-ring-write");
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return !busy_ && (!queue_.empty() || closing_ || broken_); });
    if (queue_.empty()) break;
    Pending item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    const Outcome outcome = transmit(item, /*may_wait=*/true);
    std::deque<Pending> dropped;
    lock.lock();
    busy_ = false;
    if (outcome == Outcome::Broken) {
      // The stream ended: nothing queued can reach the peer.
      broken_ = true;
      dropped.swap(queue_);
    }
    cv_.notify_all();
    if (!dropped.empty()) {
      lock.unlock();
      for (auto& pending : dropped) release_payload(pending.release);
      lock.lock();
    }
  }
  finished_ = true;
  lock.unlock();
  cv_.notify_all();
  stream_.begin_close();
}

void RingWriter::begin_close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  cv_.notify_all();
}

void RingWriter::wait_closed(Clock::time_point deadline) {
  std::deque<Pending> dropped;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    closing_ = true;
    if (!cv_.wait_until(lock, deadline, [&] { return finished_; })) {
      // The peer does not take what is queued: drop it rather than hang.
      give_up_ = true;
      dropped.swap(queue_);
    }
  }
  ring_->interrupt();
  cv_.notify_all();
  for (auto& item : dropped) release_payload(item.release);
  if (thread_.joinable()) thread_.join();
}

}  // namespace tgpg
