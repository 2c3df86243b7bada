#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "algorithms/frame.h"
#include "same_host/shared_ring.h"

namespace tgpg {

// What a RingWriter writes its frames to: the link's gRPC stream.
class FrameStream {
 public:
  virtual ~FrameStream() = default;
  // False once the stream is closing or broken; the frame is dropped then.
  virtual bool write(grpc::ByteBuffer frame) = 0;
  virtual bool ended() const = 0;
  virtual void begin_close() = 0;
  // Runs `on_end` once, as the stream ends, or at once if it has ended: a
  // thread that sleeps until the receiver gives room back hears of it then.
  // It runs on whichever thread ends the stream, under the stream's lock, so
  // it must only wake. Null removes it; once that returns it is not running.
  virtual void notify_end(std::function<void()> on_end) = 0;
};

// Sends one same-host link's frames once the link has a shared ring. Until the
// receiver maps the ring, frames go on the stream as before; once it has, the
// writer says so on the stream and appends every later data frame to the
// ring's records, copying a payload too large for a record into a slot first.
// Those copies run on the writer's own thread, which waits for the receiver to
// give a slot or record back when it holds them all, so the collective's
// thread never waits for its peer to send. Every frame of the link passes
// through here, so frames keep the order they were sent in; one that finds
// nothing queued before it and fits a free record (or goes on the stream) is
// sent at once, on the caller's thread, so that small messages keep their latency.
class RingWriter {
 public:
  using Clock = std::chrono::steady_clock;
  // Bytes of payload in a frame just made, and whether they went through the ring.
  using SentCounter = std::function<void(size_t bytes, bool through_ring)>;

  RingWriter(std::unique_ptr<SendRing> ring, FrameStream& stream, SentCounter count_sent);
  // Drops what is still queued (releasing its payloads) and joins the thread.
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // Queues a frame. `release` runs once the payload needs to stay unchanged
  // no longer: copied into the ring, written by gRPC, or dropped. False once
  // closing or after the stream ended. An abort frame goes on the stream and
  // overtakes the data queued before it, which is dropped: a failed group
  // needs none of it, and a receiver that holds every slot must still hear why.
  bool send(const FrameHeader& header, ByteView payload, std::function<void()> release);

  // No more frames are taken; the thread writes what is queued, then begins
  // closing the stream.
  void begin_close();
  // Waits for the queue to drain until `deadline`, then drops what is left;
  // the stream has begun closing when this returns.
  void wait_closed(Clock::time_point deadline);

 private:
  struct Pending {
    FrameHeader header;
    ByteView payload;
    std::function<void()> release;
  };

  enum class Outcome {
    Sent,       // on the stream or in the ring; the payload is released
    WouldWait,  // only without may_wait: nothing was done, the item is intact
    Dropped,    // given up (an abort, or a close past its deadline); released
    Broken,     // the stream ended (a write failed, or the peer went away); released
  };

  void run();
  // Whether `payload` is for the writer's thread: once the ring is mapped, a
  // payload too large for a record waits for a slot.
  bool needs_slot(ByteView payload) const;
  // Sends `item` as the link sends now. Waits for a slot or record only if
  // `may_wait`. Called only by the thread that set busy_.
  Outcome transmit(Pending& item, bool may_wait);
  // Appends `record`, waiting for a free one if `may_wait`.
  Outcome post_record(const std::string& record, bool may_wait);
  // Sleeps until the receiver gives a slot or record back after `seen`
  // releases (SendRing::releases). False, at once, when the wait is given up:
  // an abort, a close past its deadline, or the stream's end, each of which
  // interrupts the ring, so that a sleep that has begun ends too.
  bool wait_for_room(uint32_t seen);
  // Why a wait for room was given up.
  Outcome given_up() const;

  std::unique_ptr<SendRing> ring_;
  FrameStream& stream_;
  SentCounter count_sent_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool busy_ = false;       // a thread is making or writing a frame of this link
  bool closing_ = false;    // no new frames; close the stream once drained
  bool give_up_ = false;    // an abort, or a close past its deadline: no more waiting for slots
  bool broken_ = false;     // a write failed: the stream has ended
  bool finished_ = false;   // the thread has begun closing the stream and is gone
  bool switched_ = false;   // the stream carried the switch: data frames go to the ring's records (busy_ only)
  std::thread thread_;
};

}  // namespace tgpg
