#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/frame.h"

namespace tgpg {

// Between two ranks on one host, a chunk sent through gRPC is copied three
// times: into the socket, out of it into gRPC's buffer, and out of that into
// the tensor. Gloo's receiver reads straight into the tensor, so it copies
// twice. A shared ring brings grpc to two as well, neither in the kernel: the
// sender copies the chunk into a slot of a memory file that both processes
// map, and the receiver reduces or copies from that slot into place.
//
// Once the receiver has mapped the ring, the frames' headers move into the file
// too, as records in a queue: each record holds one encoded frame, whose small
// payload lies in the record itself and whose large one lies in a slot. gRPC's
// threads then take no part in a chunk's journey; a futex in the file wakes
// whichever side waits. The link's gRPC stream stays open: it carries the
// switch to the ring (so that no record overtakes a frame sent on the stream
// before it), aborts, and the end of the link, and it still breaks when the
// peer dies. Every record is decoded and checked as a frame from the stream is.
//
// When the receiver holds every slot or record (a ring schedule sends a whole
// segment before it receives), the link's RingWriter waits on its own thread
// for one to come back, as HTTP/2 flow control would make a socket wait. Until
// the receiver has mapped the ring, or when it declined it, frames go on the stream.

// What the sender announces on its stream so that the receiver can map the ring.
struct RingOffer {
  uint32_t pid = 0;     // the sender's process
  int32_t fd = -1;      // its descriptor of the memory file
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
  std::string token;    // also written in the file: proves the receiver opened the right one
};

// Where one frame's payload lies in the ring.
struct RingSlot {
  uint32_t index = 0;
  uint64_t seq = 0;     // which put filled the slot; a stale or forged reference fails
  uint64_t bytes = 0;
};

// The memory file mapped into this process; defined in shared_ring.cc.
struct RingMapping;

// The most slots a receiver maps for one stream.
constexpr uint32_t kMaxRingSlots = 64;

// The record queue's shape, fixed by the protocol. A record holds a frame of up
// to kMaxRecordBytes once encoded: any header, with a payload of a few hundred
// bytes inline. Sixteen let a sender run that far ahead of a receiver that
// sleeps; a record is given back as soon as it is read, before the frame is used.
constexpr uint32_t kRingRecords = 16;
constexpr size_t kRecordBytes = 1024;
constexpr size_t kMaxRecordBytes = kRecordBytes - sizeof(uint32_t);

// The slots a sender offers (fewer when max_queued_frames is lower). Two
// already let the receiver reduce one chunk while the sender copies the next;
// four absorb a slow turn. More only push slots out of the CPU's cache: eight
// slots of 2 MiB ran a 64 MiB allreduce 15-30% slower than four on an AMD EPYC
// (benchmarks/history.md).
constexpr uint32_t kRingSlots = 4;

// Bytes of the memory file for a ring of this shape, or 0 if the shape is out
// of bounds (no slots, too many, or a size that would overflow).
size_t ring_file_bytes(uint32_t slots, uint64_t slot_bytes);

// The sending side: owns the memory file. One per link, used by the group's
// sending threads under its own lock.
class SendRing {
 public:
  // Throws std::runtime_error when the file cannot be made (no memfd_create,
  // no memory); the link then sends everything inline.
  SendRing(uint32_t slots, uint64_t slot_bytes);
  ~SendRing();
  SendRing(const SendRing&) = delete;
  SendRing& operator=(const SendRing&) = delete;

  RingOffer offer() const;

  // Whether the receiver has mapped the ring; until then put() finds no slot.
  bool attached() const;

  // Copies `payload` into a free slot. Nothing when the receiver has not
  // mapped the ring yet, holds every slot, or the payload exceeds a slot.
  std::optional<RingSlot> put(ByteView payload);

  // Appends one encoded frame (at most kMaxRecordBytes) to the record queue
  // and wakes the receiver if it sleeps. False when the receiver has not
  // mapped the ring, or has not yet read the records before it.
  bool post(const std::string& record);

  // How many slots and records the receiver has given back so far. Read it
  // before a put() or post() that may fail, and wait_for_release() with it
  // after: a release in between then ends the wait at once.
  uint32_t releases() const;

  // Blocks until the count of releases moves past `seen`, interrupt() is
  // called, or `at_most` passes (if given). The receiver wakes the sender
  // through a futex in the file only while the sender says it waits, so a
  // ring that keeps up costs no system call.
  void wait_for_release(uint32_t seen, std::optional<std::chrono::milliseconds> at_most = std::nullopt);

  // Ends the current and every later wait_for_release() at once.
  void interrupt();

 private:
  std::unique_ptr<RingMapping> mapping_;
  std::mutex mutex_;
  uint32_t next_ = 0;
  uint64_t seq_ = 0;
  uint32_t posted_ = 0;  // records appended so far
  std::atomic<bool> interrupted_{false};
};

// The receiving side: the sender's file, mapped. Frames that refer to a slot
// hold it (through ReceivedFrame::owner) until they are dropped, and only then
// may the sender fill it again.
class ReceiveRing : public std::enable_shared_from_this<ReceiveRing> {
 public:
  // Opens the file the offer names through /proc, which the kernel allows only
  // for a process this one could inspect (the same user). Refuses anything but
  // a memory file sealed against resizing (so that it cannot shrink under the
  // mapping), of exactly the size the shape needs, holding the offer's token,
  // with `expected_slot_bytes` per slot. Throws std::runtime_error saying why.
  static std::shared_ptr<ReceiveRing> attach(const RingOffer& offer, uint64_t expected_slot_bytes);

  struct PrivateTag {};  // only attach() makes rings; make_shared needs a public constructor
  ReceiveRing(PrivateTag, std::unique_ptr<RingMapping> mapping);
  ~ReceiveRing();
  ReceiveRing(const ReceiveRing&) = delete;
  ReceiveRing& operator=(const ReceiveRing&) = delete;

  // The payload a frame refers to, and the lease that gives the slot back when
  // dropped. Throws std::runtime_error for a slot out of range, already held,
  // not filled, filled by another put, or a size over the slot's.
  std::pair<ByteView, std::shared_ptr<const void>> take(const RingSlot& slot);
  // take(), made the payload of `frame`, which then holds the slot. Throws as take() does.
  void take_into(const RingSlot& slot, ReceivedFrame& frame);

  // The next record, copied out of the file (so that the sender cannot change
  // it while it is checked) and given back at once; nothing when the sender
  // has appended none since. Throws std::runtime_error when the sender claims
  // more records than the queue holds, or a record longer than one. One
  // thread reads the records.
  std::optional<std::string> take_record();

  // How many times wake_reader() has been called. The reader reads it before
  // it looks at what would make it stop, and hands it to wait_for_record().
  uint32_t wake_count() const;

  // Blocks until the sender appends a record, wake_reader() is called after
  // wake_count() returned `wakes_seen`, or `at_most` passes (if given);
  // returns at once when a record is waiting. On kernels before Linux 5.16,
  // which lack futex_waitv, a wake that races the sleep is noticed within 50 ms.
  void wait_for_record(uint32_t wakes_seen, std::optional<std::chrono::milliseconds> at_most = std::nullopt);

  // Ends the reader's current wait, and its next one if it has not begun.
  void wake_reader();

 private:
  // Held by a frame's owner; gives its slot back when the frame is dropped.
  class Lease;
  void release(uint32_t index);

  // Tells the sender that a slot or record came back, waking it if it waits.
  void announce_release();

  std::unique_ptr<RingMapping> mapping_;
  std::mutex mutex_;
  std::vector<bool> held_;
  uint32_t taken_records_ = 0;  // this side's own count; the one in the file is for the sender
  // Moved by wake_reader(); the reader sleeps on it beside the file's
  // `published`. Only this process sees it, so the sender cannot wake or
  // hold the reader through it.
  std::atomic<uint32_t> wakes_{0};
};

}  // namespace tgpg
