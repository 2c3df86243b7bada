#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/dtype.h"
#include "algorithms/messenger.h"
#include "algorithms/op_type.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

// One running collective as seen by one rank: who it is, what it moves, and
// until when. Every frame it sends carries this identity and every frame it
// receives is checked against it.
class Collective {
 public:
  Collective(Messenger& messenger, int rank, int world, OpType op, uint64_t seq, DType dtype,
             uint64_t count, std::chrono::milliseconds timeout, size_t chunk_bytes,
             std::shared_ptr<SendTracker> tracker, uint32_t root = 0,
             std::optional<Reduction> reduction = std::nullopt);

  int rank() const { return rank_; }
  int world() const { return world_; }
  int next() const { return (rank_ + 1) % world_; }
  int prev() const { return (rank_ + world_ - 1) % world_; }
  DType dtype() const { return dtype_; }
  uint64_t count() const { return count_; }
  uint32_t root() const { return root_; }
  // Which way the data goes. Ranks that pick different ones (they disagree on
  // direct_max_bytes) could exchange chunks that line up by offset and size,
  // so the schedule travels in the header and is checked like the op.
  enum class Schedule : uint32_t { Ring = 0, Direct = 1, TwoLevel = 2 };
  void use_schedule(Schedule schedule) { schedule_ = schedule; }
  // Point-to-point messages carry the sender's tag; the receiver's must match.
  void use_tag(int64_t tag) { tag_ = tag; }
  // Float32 values to and from the ranks marked in `remote` (those on other
  // hosts) travel as `wire`, bfloat16 or float16: half the bytes on the
  // slowest links (TORCH_GRPC_PG_WIRE_DTYPE). Links inside a host keep
  // float32. Nothing changes for other dtypes, for a float32 `wire`, or where
  // no peer is remote. Every rank must pass the same `wire` and the same
  // `remote` (the handshake checks the first, the host layout gives the second).
  void use_wire_dtype(DType wire, const std::vector<bool>& remote);
  // Whether some link of this collective narrows. The algorithms then round
  // every value they pass to all ranks through the wire dtype where it starts
  // out, so that each rank ends with the same bits (collectives.cc).
  bool narrows() const { return wire_ != dtype_; }
  DType wire_dtype() const { return wire_; }
  bool narrows_with(int peer) const { return narrows() && remote_[static_cast<size_t>(peer)]; }
  // Rounds elements [offset, offset + n) of `base` through the wire dtype, in
  // place: the value this rank keeps is then the one its peers receive.
  void round_to_wire(std::byte* base, uint64_t offset, uint64_t n) const;

  // The same collective moving `count` elements: the blocks of an uneven
  // all-to-all differ in size from pair to pair, and each pair checks its own.
  Collective with_count(uint64_t count) const;

  // How received data combines; SUM for collectives that do not reduce.
  ReduceOp reduce_op() const { return reduction_ ? reduction_->op : ReduceOp::Sum; }
  size_t element_bytes() const { return element_size_; }
  size_t chunk_elements() const { return chunk_elements_; }
  Deadline deadline() const { return deadline_; }

  // "allreduce #12 (float32, 1000 elements)"
  std::string describe() const;

  // Sends elements [offset, offset + n) of `base` to `dst` without copying
  // them, or narrowed into a buffer of their own (narrows_with(dst)).
  void send(int dst, const std::byte* base, uint64_t offset, uint64_t n);
  // Receives the frame for elements [offset, offset + n) from `src`, after
  // checking that `src` is running this very collective and that the payload
  // has the size those elements have on that link.
  ReceivedFrame recv(int src, uint64_t offset, uint64_t n);
  // Blocks until the transport has released every payload this collective sent.
  void wait_sends_released();

 private:
  [[noreturn]] void fail_mismatch(int src, const FrameHeader& theirs) const;

  Messenger& messenger_;
  int rank_;
  int world_;
  OpType op_;
  uint64_t seq_;
  DType dtype_;
  uint64_t count_;
  std::chrono::milliseconds timeout_;
  Deadline deadline_;
  size_t element_size_;
  size_t chunk_elements_;
  std::shared_ptr<SendTracker> tracker_;
  uint32_t root_;
  std::optional<Reduction> reduction_;
  Schedule schedule_ = Schedule::Ring;
  DType wire_;                // dtype_ unless use_wire_dtype() narrows
  std::vector<bool> remote_;  // by rank: on another host
  int64_t tag_ = 0;
};

}  // namespace tgpg
