#include "transport/ring_reader.h"

#include <condition_variable>
#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>

#include "transport/thread_name.h"
#include "transport/wire_format.h"

namespace tgpg {

// What the mailbox resumes when the reader paused on a full queue.
class RingReader::Resumer : public ReadGate {
 public:
  void arm() {
    std::lock_guard<std::mutex> lock(mutex_);
    resumed_ = false;
  }
  void resume() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      resumed_ = true;
    }
    cv_.notify_all();
  }
  void wait(const std::atomic<bool>& stopping) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return resumed_ || stopping.load(); });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool resumed_ = false;
};

RingReader::RingReader(std::shared_ptr<ReceiveRing> ring, std::shared_ptr<Mailbox> mailbox, int src,
                       size_t max_payload_bytes, Events events)
    : ring_(std::move(ring)),
      mailbox_(std::move(mailbox)),
      src_(src),
      max_payload_bytes_(max_payload_bytes),
      events_(std::move(events)),
      resumer_(std::make_shared<Resumer>()),
      thread_([this] { run(); }) {}

RingReader::~RingReader() {
  stop();
  // An event may end the stream, and gRPC may then destroy the stream's
  // reactor, and this reader with it, inline on this reader's own thread; the
  // thread touches nothing of the reader after an event (see run).
  if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
  else if (thread_.joinable()) thread_.join();
}

void RingReader::end(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    end_reason_ = reason;
  }
  ending_.store(true, std::memory_order_release);
  ring_->wake_reader();
}

void RingReader::stop() {
  stopping_.store(true);
  ring_->wake_reader();
  resumer_->resume();
}

void RingReader::run() {
  name_this_thread("tgpg-ring-read");
  while (true) {
    // Read before the flags: end() and stop() set theirs before they wake the
    // ring, so either the look below sees the flag or the wait ends at once.
    const uint32_t wakes = ring_->wake_count();
    if (stopping_.load()) return;
    // Read before the queue: a stream that has ended had its sender's last
    // record appended before its end, so the look below finds it.
    const bool ending = ending_.load(std::memory_order_acquire);
    std::optional<std::string> record;
    try {
      record = ring_->take_record();
    } catch (const std::exception& e) {
      refuse("rank " + std::to_string(src_) + " corrupted the record queue of its shared ring (" + e.what() + ")");
      return;
    }
    if (record) {
      if (!deliver(*record)) return;
      continue;
    }
    if (ending) {
      std::string reason;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        reason = end_reason_;
      }
      mailbox_->close_source(src_, reason);
      // A copy: the event may destroy this reader (see the destructor).
      const std::function<void()> drained = events_.drained;
      if (drained) drained();
      return;
    }
    ring_->wait_for_record(wakes);
  }
}

bool RingReader::deliver(const std::string& record) {
  ReceivedFrame frame;
  try {
    DecodedMessage message = decode_record(record, max_payload_bytes_);
    if (message.ring_offer || message.ring_switch || message.frame.header.kind != FrameKind::Data) {
      throw std::runtime_error("a record holds something other than a data frame");
    }
    frame = std::move(message.frame);
    if (message.ring_slot) ring_->take_into(*message.ring_slot, frame);
  } catch (const std::exception& e) {
    refuse("rank " + std::to_string(src_) + " sent a frame through its shared ring that this rank cannot read (" +
           e.what() + "); are both ranks running the same torch-grpc-pg release and chunk_bytes?");
    return false;
  }
  // The stream the ring was offered on, not the header, says who sent the frame.
  frame.header.src_rank = static_cast<uint32_t>(src_);
  resumer_->arm();
  if (!mailbox_->deliver(src_, std::move(frame), resumer_)) resumer_->wait(stopping_);
  return true;
}

void RingReader::refuse(const std::string& reason) {
  mailbox_->fail(reason);
  // A copy: the event may destroy this reader (see the destructor).
  const std::function<void(const std::string&)> refused = events_.refused;
  if (refused) refused(reason);
}

}  // namespace tgpg
