#include "algorithms/collective.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/wire_kernels.h"

namespace tgpg {

Collective::Collective(Messenger& messenger, int rank, int world, OpType op, uint64_t seq,
                       DType dtype, uint64_t count, std::chrono::milliseconds timeout,
                       size_t chunk_bytes,
                       std::shared_ptr<SendTracker> tracker, uint32_t root,
                       std::optional<Reduction> reduction)
    : messenger_(messenger),
      rank_(rank),
      world_(world),
      op_(op),
      seq_(seq),
      dtype_(dtype),
      count_(count),
      timeout_(timeout),
      // Clamped: now() plus a timeout near its type's maximum overflows.
      deadline_(std::chrono::steady_clock::now() +
                std::clamp(timeout, std::chrono::milliseconds(0),
                           std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::hours(24 * 365)))),
      element_size_(element_size(dtype)),
      chunk_elements_(std::max<size_t>(1, chunk_bytes / element_size(dtype))),
      tracker_(std::move(tracker)),
      root_(root),
      reduction_(reduction),
      wire_(dtype) {}

void Collective::use_wire_dtype(DType wire, const std::vector<bool>& remote) {
  if (dtype_ != DType::Float32 || wire == DType::Float32) return;
  if (!is_wire_dtype(wire)) {
    throw CollectiveError(describe() + ": float32 cannot travel as " + dtype_name(wire) +
                          "; TORCH_GRPC_PG_WIRE_DTYPE takes float32, bfloat16 or float16.");
  }
  if (remote.size() != static_cast<size_t>(world_)) {
    throw CollectiveError(describe() + ": the host layout names " + std::to_string(remote.size()) +
                          " ranks, the group has " + std::to_string(world_) + ".");
  }
  bool any = false;
  for (bool r : remote) any = any || r;
  if (!any) return;
  wire_ = wire;
  remote_ = remote;
}

void Collective::round_to_wire(std::byte* base, uint64_t offset, uint64_t n) const {
  if (narrows() && n > 0) round_through_wire(base + offset * element_size_, n, wire_);
}

Collective Collective::with_count(uint64_t count) const {
  Collective copy = *this;
  copy.count_ = count;
  return copy;
}

std::string Collective::describe() const {
  std::ostringstream out;
  if (op_ == OpType::PointToPoint) {
    out << "message #" << seq_ << " (" << dtype_name(dtype_) << ", " << count_ << " elements, tag " << tag_ << ")";
    return out.str();
  }
  out << op_name(op_) << " #" << seq_ << " (" << dtype_name(dtype_) << ", " << count_
      << " elements";
  if (has_root(op_)) out << ", root " << root_;
  if (reduction_) out << ", " << reduction_name(reduction_code(reduction_));
  if (narrows()) out << ", " << dtype_name(wire_) << " between hosts";
  out << ")";
  return out.str();
}

void Collective::send(int dst, const std::byte* base, uint64_t offset, uint64_t n) {
  FrameHeader header;
  header.seq = seq_;
  header.op = static_cast<uint32_t>(op_);
  header.dtype = static_cast<uint32_t>(dtype_);
  header.count = count_;
  header.offset = offset;
  header.src_rank = static_cast<uint32_t>(rank_);
  header.root = root_;
  header.reduction = reduction_code(reduction_);
  header.schedule = static_cast<uint32_t>(schedule_);
  header.tag = tag_;
  ByteView payload = n == 0 ? ByteView{} : ByteView{base + offset * element_size_, n * element_size_};
  if (n > 0 && narrows_with(dst)) {
    // The tracker keeps the narrowed copy until the transport releases it.
    auto narrowed = std::make_shared<std::vector<std::byte>>(n * element_size(wire_));
    narrow_to_wire(narrowed->data(), payload.data, n, wire_);
    payload = ByteView{narrowed->data(), narrowed->size()};
    tracker_->hold(std::move(narrowed));
  }
  try {
    messenger_.send(dst, header, payload, tracker_);
  } catch (const CollectiveError& e) {
    throw CollectiveError(describe() + " on rank " + std::to_string(rank_) + " could not send to rank " +
                          std::to_string(dst) + ": " + e.what());
  }
}

ReceivedFrame Collective::recv(int src, uint64_t offset, uint64_t n) {
  FrameHeader expected;
  expected.seq = seq_;
  expected.op = static_cast<uint32_t>(op_);
  expected.offset = offset;
  messenger_.expect(src, expected);
  ReceivedFrame frame;
  try {
    frame = messenger_.recv(src, deadline_);
  } catch (const PeerTimeout&) {
    throw CollectiveError(describe() + " on rank " + std::to_string(rank_) + " timed out after " +
                          std::to_string(timeout_.count()) + " ms waiting for data from rank " +
                          std::to_string(src) + ". Rank " + std::to_string(src) +
                          " may be dead, stalled, or not calling this collective; if it is only "
                          "slow, raise the timeout of init_process_group or new_group.");
  } catch (const CollectiveError& e) {
    throw CollectiveError(describe() + " on rank " + std::to_string(rank_) + " failed: " + e.what());
  }
  const FrameHeader& h = frame.header;
  if (h.kind == FrameKind::Abort) {
    throw CollectiveError(describe() + " on rank " + std::to_string(rank_) + " failed because rank " +
                          std::to_string(h.src_rank) + " failed: " + h.error);
  }
  if (h.seq != seq_ || h.op != static_cast<uint32_t>(op_) ||
      h.dtype != static_cast<uint32_t>(dtype_) || h.count != count_ || h.root != root_ ||
      h.reduction != reduction_code(reduction_) || h.tag != tag_) {
    fail_mismatch(src, h);
  }
  if (h.schedule != static_cast<uint32_t>(schedule_)) {
    const auto name = [](uint32_t s) {
      return s == 1 ? "direct (one round to every peer)" : s == 2 ? "two-level (inside hosts, then across)" : "ring";
    };
    std::ostringstream out;
    out << describe() << " on rank " << rank_ << " runs the " << name(static_cast<uint32_t>(schedule_))
        << " schedule, rank " << src << " the " << name(h.schedule)
        << " one. The ranks disagree on direct_max_bytes or two_level: set TORCH_GRPC_PG_DIRECT_MAX_BYTES "
           "and TORCH_GRPC_PG_TWO_LEVEL to the same values on every rank.";
    throw CollectiveError(out.str());
  }
  // A narrowed chunk has 2 bytes per element: checked before a byte of it is read.
  frame.narrowed = narrows_with(src);
  const size_t expected_bytes = n * (frame.narrowed ? element_size(wire_) : element_size_);
  if (h.offset != offset || frame.payload_bytes() != expected_bytes) {
    std::ostringstream out;
    out << describe() << " on rank " << rank_ << ": rank " << src << " sent "
        << frame.payload_bytes() << " bytes at element " << h.offset << " where " << expected_bytes
        << " bytes at element " << offset << " were expected";
    if (frame.narrowed) out << " (" << n << " elements as " << dtype_name(wire_) << ")";
    out << ". The ranks disagree on the chunk size: set TORCH_GRPC_PG_CHUNK_BYTES "
           "to the same value on every rank.";
    throw CollectiveError(out.str());
  }
  return frame;
}

namespace {

// "rank 1", "ranks 1 and 3", "ranks 1, 2 and 3".
std::string ranks_phrase(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace

void Collective::wait_sends_released() {
  const SendTracker::Outcome outcome = tracker_->wait_released(deadline_);
  if (outcome.released) return;
  const std::string self = describe() + " on rank " + std::to_string(rank_);
  // The transport failed while this rank waited for its peers to take what
  // it sent: the failure says which peer and how, and waiting on is in vain.
  if (!outcome.abandoned.empty()) throw CollectiveError(self + " failed: " + outcome.abandoned);
  const std::string peers = outcome.holding.empty() ? "its peers" : ranks_phrase(outcome.holding);
  throw CollectiveError(self + " timed out after " + std::to_string(timeout_.count()) + " ms waiting for " + peers +
                        " to take the data it sent. " + (outcome.holding.size() == 1 ? "It" : "They") +
                        " may be stalled or no longer receiving; if " +
                        (outcome.holding.size() == 1 ? "it is" : "they are") +
                        " only slow, raise the timeout of init_process_group or new_group.");
}

void Collective::fail_mismatch(int src, const FrameHeader& theirs) const {
  std::ostringstream out;
  if (op_ == OpType::PointToPoint) {
    out << "the receive on rank " << rank_ << " expected " << describe() << " from rank " << src
        << ", which sent message #" << theirs.seq << " (" << dtype_name(static_cast<DType>(theirs.dtype)) << ", "
        << theirs.count << " elements, tag " << theirs.tag
        << "). Each receive takes the next message its peer sent to this rank, which must have the same "
           "dtype, number of elements and tag.";
    throw CollectiveError(out.str());
  }
  out << describe() << " on rank " << rank_ << " does not match rank " << src << ", which is running "
      << op_name(theirs.op) << " #" << theirs.seq << " ("
      << dtype_name(static_cast<DType>(theirs.dtype)) << ", " << theirs.count << " elements";
  if (has_root(static_cast<OpType>(theirs.op))) out << ", root " << theirs.root;
  if (theirs.reduction != 0) out << ", " << reduction_name(theirs.reduction);
  out << "). Every rank of a process group must call the same collectives in the same order, "
         "with the same dtypes, sizes, roots and reduce ops.";
  if (op_ == OpType::Alltoall && theirs.op == static_cast<uint32_t>(op_) && theirs.seq == seq_) {
    out << " In an all-to-all, the number of elements rank " << src << " sends to rank " << rank_
        << " (its input split " << rank_ << ") must equal what rank " << rank_ << " expects from it (its output split "
        << src << ").";
  }
  throw CollectiveError(out.str());
}

}  // namespace tgpg
