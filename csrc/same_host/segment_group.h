#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "algorithms/dtype.h"
#include "algorithms/reduce_op.h"
#include "same_host/segment.h"

namespace tgpg {

// How a rank waits for its peers in the segment: until the op's deadline, or
// until the group fails for another reason (a peer died, and its link broke).
struct SegmentWait {
  std::chrono::steady_clock::time_point deadline;
  // The group's failure, or "" while it is healthy; looked at while waiting.
  std::function<std::string()> failure;
  // Told when the wait for `peer` stops spinning and sleeps, and when that
  // wait is over: a status tool then sees who this rank waits for.
  std::function<void(uint32_t peer)> slow_wait;
  std::function<void()> slow_wait_over;
};

// The collectives of a process group whose ranks all map one Segment, on plain
// buffers. Each op runs in rounds of at most one slot per rank, alternating
// the segment's two buffer sets, and every rank runs the same rounds in the
// same order.
//
// Reductions run in rank order wherever more than one rank computes the same
// elements, so every rank ends with the same bytes:
//   up to kReduceAllBytes per round, each rank writes its input to its slot and
//     reduces every slot, one pass (the fewest hand-offs: small messages);
//   above, each rank writes to its slot only the parts its peers reduce,
//     reduces its own part in place from every peer's slot and publishes it in
//     its slot, then copies every other part (reduce-scatter, then allgather,
//     inside the segment: each byte read once from each peer, and no byte of a
//     rank's own part copied in or out).
// Each op first announces itself (OpDescriptor): a peer that runs another op,
// or the same op on other sizes, or this op over the network links, makes the
// op fail at once with both ranks named (CollectiveError), as a mismatch on the
// links does. A wait past the deadline throws PeerTimeout naming the ranks
// waited for.
class SegmentGroup {
 public:
  static constexpr size_t kReduceAllBytes = 64 << 10;

  SegmentGroup(Segment segment, uint32_t rank);

  uint32_t rank() const { return rank_; }
  uint32_t world() const { return segment_.ranks(); }

  // Announces op `d`, which this rank runs over the network links, so that a
  // peer that runs it in the segment fails at once instead of waiting.
  void announce_elsewhere(OpDescriptor d);

  // `data` holds `count` elements on entry and their reduction over the ranks on exit.
  void allreduce(std::byte* data, size_t count, DType dtype, ReduceOp op, OpDescriptor d, const SegmentWait& wait);
  // `data` holds `bytes` on every rank; the root's are copied to the others.
  void broadcast(std::byte* data, size_t bytes, uint32_t root, OpDescriptor d, const SegmentWait& wait);
  // `out` receives world() blocks of `bytes`, block r being rank r's `in`.
  void allgather(const std::byte* in, std::byte* out, size_t bytes, OpDescriptor d, const SegmentWait& wait);
  // `in` holds world() blocks of `count` elements; `out` receives the reduction
  // over the ranks of block rank().
  void reduce_scatter(const std::byte* in, std::byte* out, size_t count, DType dtype, ReduceOp op, OpDescriptor d,
                      const SegmentWait& wait);
  void barrier(OpDescriptor d, const SegmentWait& wait);

 private:
  // Runs op `d` over `total` units in rounds of at most `per_round`, each in
  // the next buffer set: publish(set, offset, n) fills this rank's slot, then
  // the round's hand-off (the op's first announces it), then collect(set,
  // offset, n) reads the peers' slots (and may hand off again).
  template <typename Publish, typename Collect>
  void in_rounds(size_t total, size_t per_round, const OpDescriptor& d, const SegmentWait& wait, Publish&& publish,
                 Collect&& collect);
  // The op's first hand-off: announce, then as phase().
  void begin(const OpDescriptor& d, const SegmentWait& wait);
  // This rank is done with its part of a phase; returns once every rank is,
  // after checking, in the op's first phase, that every rank runs this op.
  void phase(const OpDescriptor& d, const SegmentWait& wait, bool first);
  void wait_for(uint32_t peer, uint32_t step, const OpDescriptor& d, const SegmentWait& wait);
  // Throws CollectiveError if `peer` announced an op that is not `d`.
  void check_agreement(uint32_t peer, const OpDescriptor& d, bool must_be_equal) const;
  // The buffer set of the next round.
  uint32_t next_set() { return static_cast<uint32_t>(rounds_++ & 1); }

  Segment segment_;
  uint32_t rank_;
  uint32_t step_ = 0;     // phases this rank has finished
  uint64_t rounds_ = 0;   // rounds run, over every op
  // The segment's ranks outnumber the CPUs this process may run on: a rank that
  // waits is likely to hold the CPU that the rank it waits for needs, so it
  // yields at once instead of spinning first.
  bool oversubscribed_;
};

}  // namespace tgpg
