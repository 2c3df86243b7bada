#include "same_host/shared_ring.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <utility>

#include "same_host/futex.h"
#include "same_host/shared_file.h"

namespace tgpg {
namespace {

constexpr uint64_t kRingMagic = 0x31676e6972677074;  // "tpgring1", little-endian
constexpr size_t kPageBytes = 4096;
constexpr size_t kTokenBytes = kSharedFileTokenBytes;
constexpr char kMemfdName[] = "torch_grpc_pg-ring";
// Where futex_waitv is refused, the longest a reader sleeps before it looks
// again for a stop or an end it may have missed.
constexpr std::chrono::milliseconds kMissedWakeBound{50};

// At the start of the file.
struct RingHeader {
  uint64_t magic;
  char token[kTokenBytes];
  std::atomic<uint32_t> attached;          // set by the receiver once it has mapped the file
  std::atomic<uint32_t> released;          // counts slots and records given back; the futex the sender waits on
  std::atomic<uint32_t> sender_waiting;    // 1 while the sender waits: only then does a release wake it
  std::atomic<uint32_t> published;         // counts records appended; the futex the receiver waits on
  std::atomic<uint32_t> consumed;          // counts records read, for the sender to see which are free
  std::atomic<uint32_t> receiver_waiting;  // 1 while the receiver waits: only then does an append wake it
};
static_assert(sizeof(RingHeader) == 64, "protos/torch_grpc_pg.proto describes a header of 64 bytes");

// One per slot, after the header; a cache line each, so that the two processes
// do not write to one line for different slots.
struct alignas(64) SlotState {
  std::atomic<uint32_t> full;  // 1 from the sender's put until the receiver drops the frame
  std::atomic<uint64_t> seq;   // the put that filled it, stored before `full`
};

// One frame, encoded, in the record queue after the slot states. `bytes` is
// atomic so that the receiver reads it exactly once, whatever the sender does
// to it meanwhile.
struct Record {
  std::atomic<uint32_t> bytes;
  char data[kMaxRecordBytes];
};
static_assert(sizeof(Record) == kRecordBytes, "a record is kRecordBytes, as the protocol says");

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
size_t states_offset() { return round_up(sizeof(RingHeader), alignof(SlotState)); }
size_t records_offset(uint32_t slots) { return states_offset() + slots * sizeof(SlotState); }
size_t data_offset(uint32_t slots) { return round_up(records_offset(slots) + kRingRecords * kRecordBytes, kPageBytes); }
size_t slot_stride(uint64_t slot_bytes) { return round_up(slot_bytes, kPageBytes); }

}  // namespace

struct RingMapping {
  SharedFile file;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;

  RingMapping(SharedFile mapped, uint32_t slot_count, uint64_t bytes_per_slot)
      : file(std::move(mapped)), slots(slot_count), slot_bytes(bytes_per_slot) {}

  std::byte* base() { return file.base(); }
  RingHeader& header() { return *reinterpret_cast<RingHeader*>(base()); }
  SlotState& state(uint32_t index) { return reinterpret_cast<SlotState*>(base() + states_offset())[index]; }
  Record& record(uint32_t count) { return reinterpret_cast<Record*>(base() + records_offset(slots))[count % kRingRecords]; }
  std::byte* slot(uint32_t index) { return base() + data_offset(slots) + index * slot_stride(slot_bytes); }
};

size_t ring_file_bytes(uint32_t slots, uint64_t slot_bytes) {
  if (slots == 0 || slots > kMaxRingSlots || slot_bytes == 0 || slot_bytes > (uint64_t{1} << 32)) return 0;
  return data_offset(slots) + slots * slot_stride(slot_bytes);
}

namespace {

std::unique_ptr<RingMapping> make_ring(uint32_t slots, uint64_t slot_bytes) {
  const size_t bytes = ring_file_bytes(slots, slot_bytes);
  if (bytes == 0) {
    throw std::runtime_error("a ring of " + std::to_string(slots) + " slots of " + std::to_string(slot_bytes) +
                             " bytes is out of bounds");
  }
  auto m = std::make_unique<RingMapping>(SharedFile::create(kMemfdName, bytes, kRingMagic), slots, slot_bytes);
  // The file starts zeroed, which is every atomic's initial value; placement
  // new only begins the objects' lifetimes in the mapping (and zeroes the
  // prologue again, which is written back below).
  const SharedFileOffer offer = m->file.offer();
  RingHeader* header = new (m->base()) RingHeader{};
  header->magic = kRingMagic;
  std::memcpy(header->token, offer.token.data(), kTokenBytes);
  for (uint32_t i = 0; i < m->slots; ++i) new (&m->state(i)) SlotState{};
  return m;
}

}  // namespace

SendRing::SendRing(uint32_t slots, uint64_t slot_bytes)
    : mapping_(make_ring(slots, slot_bytes)) {}

SendRing::~SendRing() = default;

RingOffer SendRing::offer() const {
  const SharedFileOffer file = mapping_->file.offer();
  return RingOffer{file.pid, file.fd, mapping_->slots, mapping_->slot_bytes, file.token};
}

bool SendRing::attached() const {
  return mapping_->header().attached.load(std::memory_order_acquire) != 0;
}

std::optional<RingSlot> SendRing::put(ByteView payload) {
  RingMapping& m = *mapping_;
  if (payload.size > m.slot_bytes) return std::nullopt;
  if (!attached()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  for (uint32_t tried = 0; tried < m.slots; ++tried) {
    const uint32_t index = (next_ + tried) % m.slots;
    SlotState& state = m.state(index);
    // Acquire: the receiver's last reads of the slot come before its release.
    if (state.full.load(std::memory_order_acquire) != 0) continue;
    if (payload.size > 0) std::memcpy(m.slot(index), payload.data, payload.size);
    const uint64_t seq = ++seq_;
    state.seq.store(seq, std::memory_order_relaxed);
    // Release: a receiver that sees the slot full sees its data and seq.
    state.full.store(1, std::memory_order_release);
    next_ = (index + 1) % m.slots;
    return RingSlot{index, seq, payload.size};
  }
  return std::nullopt;
}

bool SendRing::post(const std::string& record) {
  RingMapping& m = *mapping_;
  if (record.size() > kMaxRecordBytes || !attached()) return false;
  RingHeader& header = m.header();
  std::lock_guard<std::mutex> lock(mutex_);
  // Acquire: the receiver has copied a record out before it counts it read.
  if (posted_ - header.consumed.load(std::memory_order_acquire) >= kRingRecords) return false;
  Record& slot = m.record(posted_);
  slot.bytes.store(static_cast<uint32_t>(record.size()), std::memory_order_relaxed);
  std::memcpy(slot.data, record.data(), record.size());
  ++posted_;
  // Also the release that makes the record's bytes visible to the receiver.
  header.published.store(posted_, std::memory_order_seq_cst);
  wake_if_waiting(header.published, header.receiver_waiting);
  return true;
}

uint32_t SendRing::releases() const { return mapping_->header().released.load(std::memory_order_seq_cst); }

void SendRing::wait_for_release(uint32_t seen, std::optional<std::chrono::milliseconds> at_most) {
  // An interrupt that comes after this look moves the count on.
  if (interrupted_.load()) return;
  RingHeader& header = mapping_->header();
  sleep_while_unmoved(header.released, seen, header.sender_waiting, at_most);
}

void SendRing::interrupt() {
  interrupted_.store(true);
  // Wakes a waiter that already went to sleep; one that has not checks the flag.
  mapping_->header().released.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(mapping_->header().released);
}

class ReceiveRing::Lease {
 public:
  Lease(std::shared_ptr<ReceiveRing> ring, uint32_t index) : ring_(std::move(ring)), index_(index) {}
  ~Lease() { ring_->release(index_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

 private:
  std::shared_ptr<ReceiveRing> ring_;  // keeps the mapping until the frame is gone
  uint32_t index_;
};

std::shared_ptr<ReceiveRing> ReceiveRing::attach(const RingOffer& offer, uint64_t expected_slot_bytes) {
  if (offer.slot_bytes != expected_slot_bytes) {
    throw std::runtime_error("its slots hold " + std::to_string(offer.slot_bytes) + " bytes, not the group's " +
                             std::to_string(expected_slot_bytes) + " (chunk_bytes)");
  }
  const size_t bytes = ring_file_bytes(offer.slots, offer.slot_bytes);
  if (bytes == 0) {
    throw std::runtime_error("it has " + std::to_string(offer.slots) + " slots, where 1 to " +
                             std::to_string(kMaxRingSlots) + " are allowed");
  }
  auto m = std::make_unique<RingMapping>(
      SharedFile::open(SharedFileOffer{offer.pid, offer.fd, offer.token}, bytes, kRingMagic), offer.slots,
      offer.slot_bytes);
  auto ring = std::make_shared<ReceiveRing>(PrivateTag{}, std::move(m));
  ring->mapping_->header().attached.store(1, std::memory_order_release);
  return ring;
}

ReceiveRing::ReceiveRing(PrivateTag, std::unique_ptr<RingMapping> mapping)
    : mapping_(std::move(mapping)), held_(mapping_->slots, false) {}

ReceiveRing::~ReceiveRing() = default;

std::pair<ByteView, std::shared_ptr<const void>> ReceiveRing::take(const RingSlot& slot) {
  RingMapping& m = *mapping_;
  if (slot.index >= m.slots) {
    throw std::runtime_error("it refers to slot " + std::to_string(slot.index) + " of a ring of " +
                             std::to_string(m.slots));
  }
  if (slot.bytes > m.slot_bytes) {
    throw std::runtime_error("it puts " + std::to_string(slot.bytes) + " bytes in a slot of " +
                             std::to_string(m.slot_bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_[slot.index]) {
      throw std::runtime_error("slot " + std::to_string(slot.index) + " is still held by an earlier frame");
    }
    SlotState& state = m.state(slot.index);
    if (state.full.load(std::memory_order_acquire) != 1 || state.seq.load(std::memory_order_relaxed) != slot.seq) {
      throw std::runtime_error("slot " + std::to_string(slot.index) + " holds no data of put #" +
                               std::to_string(slot.seq));
    }
    held_[slot.index] = true;
  }
  return {ByteView{m.slot(slot.index), slot.bytes}, std::make_shared<Lease>(shared_from_this(), slot.index)};
}

void ReceiveRing::take_into(const RingSlot& slot, ReceivedFrame& frame) {
  auto [payload, lease] = take(slot);
  frame.payload = {payload};
  frame.owner = std::move(lease);
}

void ReceiveRing::release(uint32_t index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_[index] = false;
    mapping_->state(index).full.store(0, std::memory_order_seq_cst);
  }
  announce_release();
}

void ReceiveRing::announce_release() {
  RingHeader& header = mapping_->header();
  header.released.fetch_add(1, std::memory_order_seq_cst);
  wake_if_waiting(header.released, header.sender_waiting);
}

std::optional<std::string> ReceiveRing::take_record() {
  RingMapping& m = *mapping_;
  RingHeader& header = m.header();
  // The file's counts are the sender's word only; this side keeps its own.
  const uint32_t published = header.published.load(std::memory_order_acquire);
  const uint32_t waiting = published - taken_records_;
  if (waiting == 0) return std::nullopt;
  if (waiting > kRingRecords) {
    throw std::runtime_error("it claims " + std::to_string(waiting) + " unread records in a queue of " +
                             std::to_string(kRingRecords));
  }
  const Record& record = m.record(taken_records_);
  // Read once and checked; the bytes are copied out before anything looks at
  // them, so a sender that rewrites the record meanwhile changes only its own frame.
  const uint32_t bytes = record.bytes.load(std::memory_order_relaxed);
  if (bytes > kMaxRecordBytes) {
    throw std::runtime_error("record " + std::to_string(taken_records_) + " claims " + std::to_string(bytes) +
                             " bytes, more than the " + std::to_string(kMaxRecordBytes) + " a record holds");
  }
  std::string copy(record.data, bytes);
  ++taken_records_;
  header.consumed.store(taken_records_, std::memory_order_release);
  announce_release();
  return copy;
}

uint32_t ReceiveRing::wake_count() const { return wakes_.load(std::memory_order_seq_cst); }

void ReceiveRing::wait_for_record(uint32_t wakes_seen, std::optional<std::chrono::milliseconds> at_most) {
  RingHeader& header = mapping_->header();
  // sleep_while_unmoved's hand-shake, on two words: the sender moves
  // `published` and wake_reader() moves `wakes_`, and a move of either
  // between the look below and the sleep makes futex_waitv return at once.
  header.receiver_waiting.store(1, std::memory_order_seq_cst);
  if (header.published.load(std::memory_order_seq_cst) == taken_records_ &&
      wakes_.load(std::memory_order_seq_cst) == wakes_seen) {
    const std::optional<timespec> deadline = at_most ? std::optional(monotonic_deadline(*at_most)) : std::nullopt;
    if (!futex_wait_either(header.published, taken_records_, wakes_, wakes_seen, deadline ? &*deadline : nullptr)) {
      // One word only: a wake_reader() that races the sleep is lost, and the
      // slice bounds how late it is noticed.
      futex_wait(header.published, taken_records_, at_most ? std::min(*at_most, kMissedWakeBound) : kMissedWakeBound);
    }
  }
  header.receiver_waiting.store(0, std::memory_order_relaxed);
}

void ReceiveRing::wake_reader() {
  wakes_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(wakes_, /*process_private=*/true);
  // A reader that sleeps on `published` alone (no futex_waitv).
  futex_wake_all(mapping_->header().published);
}

}  // namespace tgpg
