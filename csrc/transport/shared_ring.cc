#include "transport/shared_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <stdexcept>
#include <utility>

namespace tgpg {
namespace {

constexpr uint64_t kRingMagic = 0x31676e6972677074;  // "tpgring1", little-endian
constexpr size_t kPageBytes = 4096;
constexpr size_t kTokenBytes = 32;
constexpr char kMemfdName[] = "torch_grpc_pg-ring";
// Where futex_waitv is refused, the longest a reader sleeps before it looks
// again for a stop or an end it may have missed.
constexpr std::chrono::milliseconds kMissedWakeBound{50};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "two processes share the ring's atomics, which only lock-free atomics allow");

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

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

timespec to_timespec(std::chrono::milliseconds span) {
  const auto ms = span.count();
  return {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000L};
}

// Shared futexes (no FUTEX_PRIVATE_FLAG): the word lies in a file that two
// processes map, and the kernel matches waiter and waker by the file's page.
// std::atomic<uint32_t> is a plain 32-bit word (static_assert above), which is
// what a futex is.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::optional<std::chrono::milliseconds> at_most) {
  const std::optional<timespec> timeout = at_most ? std::optional(to_timespec(*at_most)) : std::nullopt;
  // EAGAIN (the word moved on), EINTR and ETIMEDOUT all mean: look again.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, timeout ? &*timeout : nullptr,
            nullptr, 0);
}

// `wake` is FUTEX_WAKE for a word in a ring's file, FUTEX_WAKE_PRIVATE for one
// that only this process sees.
void futex_wake_all(std::atomic<uint32_t>& word, int wake = FUTEX_WAKE) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), wake, INT_MAX, nullptr, nullptr, 0);
}

// futex_waitv (Linux 5.16) as the kernel's ABI defines it, spelled out here
// rather than taken from <linux/futex.h>, so that the build needs no headers of
// 5.16 or later (manylinux_2_28, RHEL 8 and Ubuntu 20.04 ship older ones); a
// kernel that lacks the call refuses it at run time, and readers fall back.
struct FutexWaiter {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(FutexWaiter) == 24, "struct futex_waitv is 24 bytes");
constexpr long kSysFutexWaitv = 449;  // one number on every architecture (asm-generic)
constexpr uint32_t kFutexSize32 = 0x02;  // FUTEX2_SIZE_U32

// Set once the kernel (before Linux 5.16) or a seccomp filter has refused
// futex_waitv; the process then sleeps on one word at a time.
std::atomic<bool> futex_waitv_refused{false};

// Sleeps until `shared` (a word in a ring's file) leaves `shared_seen` or
// `local` (a word of this process) leaves `local_seen`, or the deadline on
// CLOCK_MONOTONIC passes (none: no deadline). False where futex_waitv is
// refused; the caller then sleeps some other way.
bool futex_wait_either(std::atomic<uint32_t>& shared, uint32_t shared_seen, std::atomic<uint32_t>& local,
                       uint32_t local_seen, const timespec* deadline) {
  if (futex_waitv_refused.load(std::memory_order_relaxed)) return false;
  FutexWaiter waiters[2] = {};
  waiters[0].uaddr = reinterpret_cast<uintptr_t>(&shared);
  waiters[0].val = shared_seen;
  waiters[0].flags = kFutexSize32;
  waiters[1].uaddr = reinterpret_cast<uintptr_t>(&local);
  waiters[1].val = local_seen;
  waiters[1].flags = kFutexSize32 | FUTEX_PRIVATE_FLAG;
  if (::syscall(kSysFutexWaitv, waiters, 2, 0, deadline, CLOCK_MONOTONIC) >= 0) return true;
  // EAGAIN (a word moved on), EINTR and ETIMEDOUT all mean: look again. Any
  // other answer would come back at once on every call: a reader that kept
  // asking would spin.
  if (errno == EAGAIN || errno == EINTR || errno == ETIMEDOUT) return true;
  futex_waitv_refused.store(true, std::memory_order_relaxed);
  return false;
}

timespec monotonic_deadline(std::chrono::milliseconds after) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const timespec span = to_timespec(after);
  timespec deadline{now.tv_sec + span.tv_sec, now.tv_nsec + span.tv_nsec};
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  return deadline;
}

// The two hand-shakes of the file, slots and records given back (the sender
// sleeps on `released`) and records appended (the receiver sleeps on
// `published`), are one protocol: the sleeper raises its `waiting` flag, looks
// at the word once more, and sleeps only if it still holds `seen`; the other
// side moves the word on, then wakes only if the flag is up. seq_cst on both
// sides: either the sleeper sees the word move before it sleeps, or the other
// side sees the flag and wakes it. A move between the look and the sleep makes
// the futex return at once.
void sleep_while_unmoved(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<uint32_t>& waiting,
                         std::optional<std::chrono::milliseconds> at_most) {
  waiting.store(1, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == seen) futex_wait(word, seen, at_most);
  waiting.store(0, std::memory_order_relaxed);
}

// The other side of sleep_while_unmoved, once `word` has moved on (seq_cst).
void wake_if_waiting(std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiting) {
  if (waiting.load(std::memory_order_seq_cst) != 0) futex_wake_all(word);
}

// Not a secret: it tells the receiver that the file it opened is the one offered.
std::string random_token() {
  std::string token(kTokenBytes, '\0');
  size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t got = ::getrandom(token.data() + filled, token.size() - filled, 0);
    if (got < 0 && errno != EINTR) throw std::runtime_error(system_error("getrandom"));
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return token;
}

}  // namespace

struct RingMapping {
  int fd = -1;
  std::byte* base = nullptr;
  size_t bytes = 0;
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;

  RingMapping(uint32_t slot_count, uint64_t bytes_per_slot)
      : bytes(ring_file_bytes(slot_count, bytes_per_slot)), slots(slot_count), slot_bytes(bytes_per_slot) {}
  ~RingMapping() {
    if (base != nullptr) ::munmap(base, bytes);
    if (fd >= 0) ::close(fd);
  }
  RingMapping(const RingMapping&) = delete;
  RingMapping& operator=(const RingMapping&) = delete;

  void map() {
    void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) throw std::runtime_error(system_error("mmap"));
    base = static_cast<std::byte*>(mapped);
  }
  RingHeader& header() { return *reinterpret_cast<RingHeader*>(base); }
  SlotState& state(uint32_t index) { return reinterpret_cast<SlotState*>(base + states_offset())[index]; }
  Record& record(uint32_t count) { return reinterpret_cast<Record*>(base + records_offset(slots))[count % kRingRecords]; }
  std::byte* slot(uint32_t index) { return base + data_offset(slots) + index * slot_stride(slot_bytes); }
};

size_t ring_file_bytes(uint32_t slots, uint64_t slot_bytes) {
  if (slots == 0 || slots > kMaxRingSlots || slot_bytes == 0 || slot_bytes > (uint64_t{1} << 32)) return 0;
  return data_offset(slots) + slots * slot_stride(slot_bytes);
}

SendRing::SendRing(uint32_t slots, uint64_t slot_bytes)
    : mapping_(std::make_unique<RingMapping>(slots, slot_bytes)), token_(random_token()) {
  RingMapping& m = *mapping_;
  if (m.bytes == 0) {
    throw std::runtime_error("a ring of " + std::to_string(slots) + " slots of " + std::to_string(slot_bytes) +
                             " bytes is out of bounds");
  }
  m.fd = ::memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m.fd < 0) throw std::runtime_error(system_error("memfd_create"));
  if (::ftruncate(m.fd, static_cast<off_t>(m.bytes)) != 0) throw std::runtime_error(system_error("ftruncate"));
  // A file shrunk under the receiver's mapping would kill it with SIGBUS at
  // its next read; sealed, the size is fixed for good.
  if (::fcntl(m.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw std::runtime_error(system_error("sealing the ring's memory file"));
  }
  m.map();
  // The file starts zeroed, which is every atomic's initial value; placement
  // new only begins the objects' lifetimes in the mapping.
  RingHeader* header = new (m.base) RingHeader{};
  header->magic = kRingMagic;
  std::memcpy(header->token, token_.data(), kTokenBytes);
  for (uint32_t i = 0; i < m.slots; ++i) new (&m.state(i)) SlotState{};
}

SendRing::~SendRing() = default;

RingOffer SendRing::offer() const {
  return RingOffer{static_cast<uint32_t>(::getpid()), mapping_->fd, mapping_->slots, mapping_->slot_bytes, token_};
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
  auto m = std::make_unique<RingMapping>(offer.slots, offer.slot_bytes);
  if (m->bytes == 0) {
    throw std::runtime_error("it has " + std::to_string(offer.slots) + " slots, where 1 to " +
                             std::to_string(kMaxRingSlots) + " are allowed");
  }
  if (offer.pid == 0 || offer.fd < 0 || offer.token.size() != kTokenBytes) {
    throw std::runtime_error("it names no process, no file or no token");
  }
  const std::string path = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
  // Only a memory file, so that a forged offer cannot make this process open
  // a device or a pipe of the peer's. The peer could swap the descriptor after
  // this check, but a peer that authenticated can send any data anyway; the
  // checks on the opened file below are what keep this process safe.
  char target[64] = {};
  const ssize_t length = ::readlink(path.c_str(), target, sizeof(target) - 1);
  if (length < 0) throw std::runtime_error(system_error("reading " + path));
  if (std::strncmp(target, "/memfd:", 7) != 0) {
    throw std::runtime_error(path + " is not a memory file");
  }
  m->fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (m->fd < 0) throw std::runtime_error(system_error("opening " + path));
  // The seals first: until they are set the peer could still cut the file
  // after its size was checked, and a read past the new end kills this
  // process with SIGBUS. Once sealed, the size checked below is the size for good.
  const int seals = ::fcntl(m->fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    throw std::runtime_error("the file is not sealed against resizing");
  }
  struct stat info = {};
  if (::fstat(m->fd, &info) != 0) throw std::runtime_error(system_error("fstat"));
  if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) != m->bytes) {
    throw std::runtime_error("the file has " + std::to_string(info.st_size) + " bytes, not the " +
                             std::to_string(m->bytes) + " its shape needs");
  }
  m->map();
  // The mapping keeps the file; this process has no other use for the descriptor.
  ::close(std::exchange(m->fd, -1));
  if (m->header().magic != kRingMagic || std::memcmp(m->header().token, offer.token.data(), kTokenBytes) != 0) {
    throw std::runtime_error("the file does not hold the offer's token");
  }
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
  futex_wake_all(wakes_, FUTEX_WAKE_PRIVATE);
  // A reader that sleeps on `published` alone (no futex_waitv).
  futex_wake_all(mapping_->header().published);
}

}  // namespace tgpg
