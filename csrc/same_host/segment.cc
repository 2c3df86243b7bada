#include "same_host/segment.h"

#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "same_host/futex.h"

namespace tgpg {
namespace {

constexpr char kMemfdName[] = "torch_grpc_pg-segment";
constexpr size_t kPageBytes = 4096;
// Two cache lines per block: some processors fetch lines in pairs, and a
// rank's block is written by that rank alone.
constexpr size_t kBlockBytes = 128;
constexpr size_t kHeaderBytes = 128;  // the file's prologue, padded

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
size_t slot_stride(uint64_t slot_bytes) { return round_up(slot_bytes, kPageBytes); }
size_t data_offset(uint32_t ranks) { return round_up(kHeaderBytes + ranks * kBlockBytes, kPageBytes); }

}  // namespace

// One rank's control words. The descriptor is written under a sequence lock
// (`version` odd while it changes), so a reader never takes half of one op and
// half of the next for an op.
struct alignas(kBlockBytes) Segment::RankBlock {
  std::atomic<uint32_t> step;     // this rank's progress: the futex its peers wait on
  std::atomic<uint32_t> waiters;  // peers asleep on `step`: only then does advance() wake
  std::atomic<uint32_t> version;
  std::atomic<uint32_t> op;
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> count;
  std::atomic<uint32_t> dtype;
  std::atomic<uint32_t> root;
  std::atomic<uint32_t> reduction;
  std::atomic<uint32_t> path;
};

bool OpDescriptor::operator==(const OpDescriptor& o) const {
  return seq == o.seq && op == o.op && dtype == o.dtype && count == o.count && root == o.root &&
         reduction == o.reduction && path == o.path;
}

size_t segment_file_bytes(uint32_t ranks, uint64_t slot_bytes) {
  if (ranks == 0 || ranks > kMaxSegmentRanks || slot_bytes == 0 || slot_bytes > (uint64_t{1} << 30)) return 0;
  return data_offset(ranks) + 2 * static_cast<size_t>(ranks) * slot_stride(slot_bytes);
}

Segment::Segment(SharedFile file, uint32_t ranks, uint64_t slot_bytes)
    : file_(std::move(file)), ranks_(ranks), slot_bytes_(slot_bytes) {}

Segment Segment::create(uint32_t ranks, uint64_t slot_bytes) {
  const size_t bytes = segment_file_bytes(ranks, slot_bytes);
  if (bytes == 0) {
    throw std::runtime_error("a segment for " + std::to_string(ranks) + " ranks with slots of " +
                             std::to_string(slot_bytes) + " bytes is out of bounds");
  }
  Segment segment(SharedFile::create(kMemfdName, bytes, kSegmentMagic), ranks, slot_bytes);
  // The file starts zeroed, every atomic's initial value; placement new only
  // begins the blocks' lifetimes in the mapping.
  for (uint32_t r = 0; r < ranks; ++r) new (&segment.block(r)) RankBlock{};
  return segment;
}

Segment Segment::open(const SharedFileOffer& offer, uint32_t ranks, uint64_t slot_bytes) {
  const size_t bytes = segment_file_bytes(ranks, slot_bytes);
  if (bytes == 0) {
    throw std::runtime_error("a segment for " + std::to_string(ranks) + " ranks with slots of " +
                             std::to_string(slot_bytes) + " bytes is out of bounds");
  }
  return Segment(SharedFile::open(offer, bytes, kSegmentMagic), ranks, slot_bytes);
}

Segment::RankBlock& Segment::block(uint32_t rank) const {
  static_assert(sizeof(RankBlock) == kBlockBytes, "a rank's block is two cache lines");
  return reinterpret_cast<RankBlock*>(file_.base() + kHeaderBytes)[rank];
}

std::byte* Segment::slot(uint32_t set, uint32_t rank) const {
  return file_.base() + data_offset(ranks_) + (static_cast<size_t>(set & 1) * ranks_ + rank) * slot_stride(slot_bytes_);
}

void Segment::announce(uint32_t rank, const OpDescriptor& d) {
  RankBlock& b = block(rank);
  const uint32_t v = b.version.load(std::memory_order_relaxed);
  b.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  b.seq.store(d.seq, std::memory_order_relaxed);
  b.op.store(d.op, std::memory_order_relaxed);
  b.dtype.store(d.dtype, std::memory_order_relaxed);
  b.count.store(d.count, std::memory_order_relaxed);
  b.root.store(d.root, std::memory_order_relaxed);
  b.reduction.store(d.reduction, std::memory_order_relaxed);
  b.path.store(d.path, std::memory_order_relaxed);
  b.version.store(v + 2, std::memory_order_release);
}

std::optional<OpDescriptor> Segment::announced(uint32_t rank) const {
  const RankBlock& b = block(rank);
  // An announce is a few stores; a writer stopped in the middle of one (gone,
  // or descheduled for long) is not waited for.
  for (int tries = 0; tries < 100000; ++tries) {
    const uint32_t before = b.version.load(std::memory_order_acquire);
    if (before & 1) continue;
    OpDescriptor d;
    d.seq = b.seq.load(std::memory_order_relaxed);
    d.op = b.op.load(std::memory_order_relaxed);
    d.dtype = b.dtype.load(std::memory_order_relaxed);
    d.count = b.count.load(std::memory_order_relaxed);
    d.root = b.root.load(std::memory_order_relaxed);
    d.reduction = b.reduction.load(std::memory_order_relaxed);
    d.path = b.path.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (b.version.load(std::memory_order_relaxed) == before) return d;
  }
  return std::nullopt;
}

void Segment::advance(uint32_t rank, uint32_t step) {
  RankBlock& b = block(rank);
  // seq_cst with the sleeper's count of waiters: either it sees the new step
  // before it sleeps, or this sees it counted and wakes it.
  b.step.store(step, std::memory_order_seq_cst);
  if (b.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(b.step);
}

uint32_t Segment::step(uint32_t rank) const { return block(rank).step.load(std::memory_order_acquire); }

void Segment::wait_while(uint32_t rank, uint32_t seen, std::chrono::milliseconds at_most) {
  RankBlock& b = block(rank);
  b.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (b.step.load(std::memory_order_seq_cst) == seen) futex_wait(b.step, seen, at_most);
  b.waiters.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace tgpg
