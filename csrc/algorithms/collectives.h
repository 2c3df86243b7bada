#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algorithms/collective.h"
#include "algorithms/host_layout.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

// Each function runs one collective over a contiguous host buffer on behalf of
// one rank and returns once this rank's part is done and its buffer final.
// All ranks must call the same function with matching arguments.

// Combines `buf` across ranks in place. Small buffers go to every peer at once
// (one round trip); large ones take the bandwidth-optimal ring: reduce-scatter
// then allgather, chunked so that sending, receiving and reducing overlap.
// When `hosts` says the ranks sit on several hosts with equally many ranks
// each, the ring runs in two levels: inside each host, then across hosts.
void allreduce(Collective& c, std::byte* buf, size_t direct_max_bytes, const HostLayout& hosts = {});

// Copies the root's `buf` to every rank, pipelined along the ring from the root.
void broadcast(Collective& c, std::byte* buf, size_t direct_max_bytes);

// `out` holds world blocks of c.count() elements; this rank's block must
// already be in place. Fills in the others around the ring.
void allgather(Collective& c, std::byte* out);

// `buf` holds world blocks of c.count() elements; afterwards block `rank` holds
// the reduction of that block over all ranks (the other blocks are scratch).
void reduce_scatter(Collective& c, std::byte* buf);

// Block-wise exchanges of c.count() elements straight between the ranks
// involved. `in` is read until the collective's sends are released.
// gather: the root fills `out` (world blocks) with every rank's `in`.
void gather(Collective& c, const std::byte* in, std::byte* out);
// scatter: block i of the root's `in` (world blocks) lands in rank i's `out`.
void scatter(Collective& c, const std::byte* in, std::byte* out);
// alltoall: block j of rank i's `in` lands in block i of rank j's `out`.
void alltoall(Collective& c, const std::byte* in, std::byte* out);

// An element range of a buffer.
struct Block {
  uint64_t offset;
  uint64_t count;
};
// Uneven alltoall: rank i's `send[j]` of `in` lands in rank j's `recv[i]` of
// `out`. Each pair's frames carry the size of their block, which the receiver
// checks against the block it expects.
void alltoallv(Collective& c, const std::byte* in, const std::vector<Block>& send, std::byte* out,
               const std::vector<Block>& recv);

// Point-to-point: one message of c.count() elements to or from one peer, on a
// messenger of its own. The collective's sequence number counts the messages
// of the pair, so that a receive can only take the message it is meant for.
void send_message(Collective& c, int dst, const std::byte* data);
void recv_message(Collective& c, int src, std::byte* data);

// Returns once every rank has entered the barrier (dissemination barrier:
// ceil(log2(world)) rounds of one message).
void barrier(Collective& c);

}  // namespace tgpg
