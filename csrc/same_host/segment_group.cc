#include "same_host/segment_group.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/op_type.h"
#include "algorithms/reduce_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tgpg {
namespace {

using Clock = std::chrono::steady_clock;

// A peer that is running arrives within microseconds; one that is not (a
// rank still computing, a slow start) is slept on, so that a waiting rank
// leaves its core to whoever needs it. First a spin that only asks the core to
// pause, then one that yields it, then futex sleeps of at most kSleepSlice,
// between which the wait looks at the group's failure and its deadline. Where
// the ranks outnumber the CPUs, the spinning is skipped: the peer waited for
// may need this very CPU.
constexpr auto kSpinFor = std::chrono::microseconds(20);
constexpr auto kYieldFor = std::chrono::microseconds(200);
constexpr auto kYieldForOversubscribed = std::chrono::milliseconds(2);
constexpr auto kSleepSlice = std::chrono::milliseconds(50);
constexpr int kFirstPauses = 256;
constexpr int kPausesPerLook = 64;

void pause_core() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

uint32_t cpus_to_run_on() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return static_cast<uint32_t>(std::max(1, CPU_COUNT(&cpus)));
}

bool reached(uint32_t step, uint32_t target) { return static_cast<int32_t>(step - target) >= 0; }

std::string describe(const OpDescriptor& d) {
  std::ostringstream out;
  out << op_name(d.op) << " #" << d.seq << " (" << dtype_name(static_cast<DType>(d.dtype)) << ", " << d.count
      << " elements";
  if (has_root(static_cast<OpType>(d.op))) out << ", root " << d.root;
  if (d.reduction != 0) out << ", " << reduction_name(d.reduction);
  out << ")";
  return out.str();
}

// Elements [begin, end) of `count` that rank `r` of `world` reduces.
std::pair<size_t, size_t> part_of(size_t count, uint32_t world, uint32_t r) {
  const size_t base = count / world, extra = count % world;
  const size_t begin = r * base + std::min<size_t>(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

}  // namespace

SegmentGroup::SegmentGroup(Segment segment, uint32_t rank)
    : segment_(std::move(segment)), rank_(rank), oversubscribed_(world() > cpus_to_run_on()) {}

void SegmentGroup::announce_elsewhere(OpDescriptor d) {
  d.path = kPathLinks;
  segment_.announce(rank_, d);
}

void SegmentGroup::begin(const OpDescriptor& d, const SegmentWait& wait) {
  segment_.announce(rank_, d);
  phase(d, wait, /*first=*/true);
}

void SegmentGroup::phase(const OpDescriptor& d, const SegmentWait& wait, bool first) {
  segment_.advance(rank_, ++step_);
  for (uint32_t peer = 0; peer < world(); ++peer) {
    if (peer != rank_) wait_for(peer, step_, d, wait);
  }
  if (!first) return;
  for (uint32_t peer = 0; peer < world(); ++peer) {
    if (peer != rank_) check_agreement(peer, d, /*must_be_equal=*/true);
  }
}

void SegmentGroup::check_agreement(uint32_t peer, const OpDescriptor& d, bool must_be_equal) const {
  const std::optional<OpDescriptor> announced = segment_.announced(peer);
  if (!announced) return;  // cannot tell now; the wait goes on
  const OpDescriptor& theirs = *announced;
  // Still on an earlier op, which it will finish: not yet a disagreement.
  if (!must_be_equal && theirs.seq < d.seq) return;
  // Already on a later op: it left this one's first phase after finding this
  // rank's announcement equal to its own, which is as good.
  if (theirs.seq > d.seq) return;
  if (theirs == d) return;
  std::ostringstream out;
  out << describe(d) << " on rank " << rank_;
  if (theirs.seq == d.seq && theirs.path != d.path) {
    out << " runs in the ranks' shared memory segment, but rank " << peer << " runs " << describe(theirs)
        << " over the network links";
  } else {
    out << " does not match rank " << peer << ", which is running " << describe(theirs);
  }
  out << ". Every rank of a process group must call the same collectives in the same order, with the same "
         "dtypes, sizes, roots and reduce ops.";
  throw CollectiveError(out.str());
}

void SegmentGroup::wait_for(uint32_t peer, uint32_t step, const OpDescriptor& d, const SegmentWait& wait) {
  // Most waits end within a few pauses: the clock is not read for those.
  const int first_pauses = oversubscribed_ ? 0 : kFirstPauses;
  for (int i = 0; i < first_pauses; ++i) {
    if (reached(segment_.step(peer), step)) return;
    pause_core();
  }
  const auto start = Clock::now();
  bool told = false;
  struct TellOver {  // also when the wait ends in an exception
    const SegmentWait& wait;
    const bool& told;
    ~TellOver() {
      if (told && wait.slow_wait_over) wait.slow_wait_over();
    }
  } tell_over{wait, told};
  while (!reached(segment_.step(peer), step)) {
    const auto now = Clock::now();
    if (!oversubscribed_ && now - start < kSpinFor) {
      for (int i = 0; i < kPausesPerLook && !reached(segment_.step(peer), step); ++i) pause_core();
      continue;
    }
    if (now - start < (oversubscribed_ ? kYieldForOversubscribed : kYieldFor)) {
      sched_yield();
      continue;
    }
    // Slow: worth a look at whether the peer is on another op altogether.
    check_agreement(peer, d, /*must_be_equal=*/false);
    const std::string failure = wait.failure ? wait.failure() : std::string();
    if (!failure.empty()) {
      throw CollectiveError(describe(d) + " on rank " + std::to_string(rank_) + " failed: " + failure);
    }
    if (now >= wait.deadline) {
      throw PeerTimeout(describe(d) + " on rank " + std::to_string(rank_) + " timed out waiting for rank " +
                        std::to_string(peer) + " in the ranks' shared memory segment; rank " + std::to_string(peer) +
                        " may be stalled, or still busy with earlier work. If it is only slow, raise the timeout "
                        "of init_process_group or new_group.");
    }
    const uint32_t seen = segment_.step(peer);
    if (reached(seen, step)) break;
    if (!told && wait.slow_wait) wait.slow_wait(peer);
    told = true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wait.deadline - now);
    segment_.wait_while(peer, seen, std::clamp(left, std::chrono::milliseconds(1), kSleepSlice));
  }
}

template <typename Publish, typename Collect>
void SegmentGroup::in_rounds(size_t total, size_t per_round, const OpDescriptor& d, const SegmentWait& wait,
                             Publish&& publish, Collect&& collect) {
  // One round even for nothing to move: the ranks still agree that they ran the op.
  bool first = true;
  for (size_t offset = 0; first || offset < total; offset += per_round) {
    const size_t n = std::min(per_round, total - offset);
    const uint32_t set = next_set();
    publish(set, offset, n);
    if (first) begin(d, wait);
    else phase(d, wait, false);
    first = false;
    collect(set, offset, n);
  }
}

void SegmentGroup::allreduce(std::byte* data, size_t count, DType dtype, ReduceOp op, OpDescriptor d,
                             const SegmentWait& wait) {
  d.path = kPathSegment;
  const size_t element = element_size(dtype);
  // This rank's part of a round of `n` elements, which it reduces when the round
  // is split; [n, n) when every rank reduces the whole round.
  const auto own_part = [&](size_t n) {
    const bool split = world() > 1 && n * element > kReduceAllBytes;
    return split ? part_of(n, world(), rank_) : std::pair<size_t, size_t>{n, n};
  };
  const auto publish = [&](uint32_t set, size_t offset, size_t n) {
    // Everything but this rank's own part, each piece for the rank that reduces it.
    const std::byte* chunk = data + offset * element;
    std::byte* mine = segment_.slot(set, rank_);
    const auto [begin_at, end_at] = own_part(n);
    if (begin_at > 0) std::memcpy(mine, chunk, begin_at * element);
    if (end_at < n) std::memcpy(mine + end_at * element, chunk + end_at * element, (n - end_at) * element);
  };
  const auto collect = [&](uint32_t set, size_t offset, size_t n) {
    if (n == 0 || world() == 1) return;
    std::byte* chunk = data + offset * element;
    const auto [begin_at, end_at] = own_part(n);
    if (begin_at == n) {
      std::memcpy(chunk, segment_.slot(set, 0), n * element);
      for (uint32_t r = 1; r < world(); ++r) reduce_into(chunk, segment_.slot(set, r), n, dtype, op);
      return;
    }
    // This rank's part, reduced in place from every peer's slot, then published
    // in its own slot, where no peer reads that part until the next phase.
    const size_t part = end_at - begin_at;
    std::byte* reduced = chunk + begin_at * element;
    for (uint32_t r = 0; r < world(); ++r) {
      if (r != rank_ && part > 0) reduce_into(reduced, segment_.slot(set, r) + begin_at * element, part, dtype, op);
    }
    if (part > 0) std::memcpy(segment_.slot(set, rank_) + begin_at * element, reduced, part * element);
    phase(d, wait, false);
    for (uint32_t r = 0; r < world(); ++r) {
      const auto [from, to] = part_of(n, world(), r);
      if (r != rank_ && to > from) {
        std::memcpy(chunk + from * element, segment_.slot(set, r) + from * element, (to - from) * element);
      }
    }
  };
  in_rounds(count, std::max<size_t>(1, segment_.slot_bytes() / element), d, wait, publish, collect);
}

void SegmentGroup::broadcast(std::byte* data, size_t bytes, uint32_t root, OpDescriptor d, const SegmentWait& wait) {
  d.path = kPathSegment;
  in_rounds(
      bytes, segment_.slot_bytes(), d, wait,
      [&](uint32_t set, size_t offset, size_t n) {
        if (rank_ == root && n > 0) std::memcpy(segment_.slot(set, root), data + offset, n);
      },
      [&](uint32_t set, size_t offset, size_t n) {
        if (rank_ != root && n > 0) std::memcpy(data + offset, segment_.slot(set, root), n);
      });
}

void SegmentGroup::allgather(const std::byte* in, std::byte* out, size_t bytes, OpDescriptor d,
                             const SegmentWait& wait) {
  d.path = kPathSegment;
  in_rounds(
      bytes, segment_.slot_bytes(), d, wait,
      [&](uint32_t set, size_t offset, size_t n) {
        if (n > 0) std::memcpy(segment_.slot(set, rank_), in + offset, n);
      },
      [&](uint32_t set, size_t offset, size_t n) {
        for (uint32_t r = 0; r < world() && n > 0; ++r) {
          std::memcpy(out + r * bytes + offset, segment_.slot(set, r), n);
        }
      });
}

void SegmentGroup::reduce_scatter(const std::byte* in, std::byte* out, size_t count, DType dtype, ReduceOp op,
                                  OpDescriptor d, const SegmentWait& wait) {
  d.path = kPathSegment;
  const size_t element = element_size(dtype);
  // A round carries the same piece of every rank's block: world() pieces per slot.
  const size_t per_round = std::max<size_t>(1, segment_.slot_bytes() / (element * world()));
  in_rounds(
      count, per_round, d, wait,
      [&](uint32_t set, size_t offset, size_t n) {
        std::byte* mine = segment_.slot(set, rank_);
        for (uint32_t r = 0; r < world() && n > 0; ++r) {
          std::memcpy(mine + r * n * element, in + (r * count + offset) * element, n * element);
        }
      },
      [&](uint32_t set, size_t offset, size_t n) {
        if (n == 0) return;
        std::byte* result = out + offset * element;
        std::memcpy(result, segment_.slot(set, 0) + rank_ * n * element, n * element);
        for (uint32_t r = 1; r < world(); ++r) {
          reduce_into(result, segment_.slot(set, r) + rank_ * n * element, n, dtype, op);
        }
      });
}

void SegmentGroup::barrier(OpDescriptor d, const SegmentWait& wait) {
  d.path = kPathSegment;
  next_set();
  begin(d, wait);
}

}  // namespace tgpg
