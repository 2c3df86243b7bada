#pragma once

#include <cstdint>

namespace tgpg {

// Which collective a frame belongs to. Travels in frame headers so that a rank
// can tell a peer that called a different collective; never renumber.
enum class OpType : uint32_t {
  Allreduce = 1,
  Broadcast = 2,
  Allgather = 3,
  Barrier = 4,
  AllreduceCoalesced = 5,
  Reduce = 6,
  Gather = 7,
  Scatter = 8,
  ReduceScatter = 9,
  Alltoall = 10,
  // send/recv: one message from one rank to one peer, on the group's
  // point-to-point streams; seq numbers the messages of that pair.
  PointToPoint = 11,
};

const char* op_name(OpType op);
const char* op_name(uint32_t op);
// Whether the collective has a root rank (broadcast, reduce, gather, scatter).
bool has_root(OpType op);

}  // namespace tgpg
