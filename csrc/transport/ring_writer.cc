#include "transport/ring_writer.h"

#include <utility>

#include "transport/wire_format.h"

namespace tgpg {
namespace {

// How long one wait for a slot sleeps at most. A release or an interrupt ends
// it sooner; the bound is only how late a stream that ended on its own is noticed.
constexpr std::chrono::milliseconds kSlotWaitSlice{50};

void release_payload(std::function<void()>& release) {
  if (release) std::exchange(release, nullptr)();
}

}  // namespace

RingWriter::RingWriter(std::unique_ptr<SendRing> ring, FrameStream& stream, SentCounter count_sent)
    : ring_(std::move(ring)), stream_(stream), count_sent_(std::move(count_sent)), thread_([this] { run(); }) {}

// A deadline already past: whatever is still queued is dropped at once.
RingWriter::~RingWriter() { wait_closed(Clock::now()); }

bool RingWriter::belongs_in_ring(ByteView payload) const {
  return payload.size >= kMinRingPayloadBytes && ring_->attached();
}

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
  if (busy_ || !queue_.empty() || belongs_in_ring(payload)) {
    queue_.push_back(Pending{header, payload, std::move(release)});
    lock.unlock();
    cv_.notify_all();
    for (auto& item : dropped) release_payload(item.release);
    return true;
  }
  // Nothing before it and no slot to wait for: written now, with no hand-off,
  // so small messages keep their latency.
  busy_ = true;
  lock.unlock();
  for (auto& item : dropped) release_payload(item.release);
  count_sent_(payload.size, /*through_ring=*/false);
  const bool written = stream_.write(encode_frame(header, payload, std::move(release)));
  lock.lock();
  busy_ = false;
  broken_ = broken_ || !written;
  lock.unlock();
  cv_.notify_all();
  return written;
}

std::optional<grpc::ByteBuffer> RingWriter::make_frame(Pending& item) {
  if (belongs_in_ring(item.payload)) {
    for (;;) {
      if (std::optional<RingSlot> slot = ring_->put(item.payload)) {
        release_payload(item.release);
        count_sent_(item.payload.size, /*through_ring=*/true);
        return encode_ring_frame(item.header, *slot);
      }
      bool stop = stream_.ended();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop = stop || give_up_;
      }
      if (stop) {
        release_payload(item.release);
        return std::nullopt;
      }
      ring_->wait_for_free_slot(kSlotWaitSlice);
    }
  }
  count_sent_(item.payload.size, /*through_ring=*/false);
  return encode_frame(item.header, item.payload, std::move(item.release));
}

void RingWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return !busy_ && (!queue_.empty() || closing_ || broken_); });
    if (queue_.empty()) break;
    Pending item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::optional<grpc::ByteBuffer> frame = make_frame(item);
    const bool written = !frame || stream_.write(std::move(*frame));
    std::deque<Pending> dropped;
    lock.lock();
    busy_ = false;
    if (!written) {
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
