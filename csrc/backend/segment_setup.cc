// The shared segment of a group whose ranks all live on one host: made by rank
// 0 and offered through the store, opened by the others, and used only if
// every rank mapped it (decided alike on every rank, from what each reported).
#include <unistd.h>

#include <sstream>

#include "backend/process_group_grpc.h"
#include "backend/store_access.h"
#include "algorithms/op_type.h"
#include "transport/log.h"

namespace tgpg {
namespace {

// The offer as the store carries it: "pid fd token-in-hex".
std::string offer_text(const SharedFileOffer& offer) {
  static const char digits[] = "0123456789abcdef";
  std::string token;
  for (unsigned char c : offer.token) {
    token += digits[c >> 4];
    token += digits[c & 15];
  }
  return std::to_string(offer.pid) + " " + std::to_string(offer.fd) + " " + token;
}

SharedFileOffer parse_offer(const std::string& text) {
  std::istringstream in(text);
  SharedFileOffer offer;
  std::string token;
  if (!(in >> offer.pid >> offer.fd >> token) || token.size() != 2 * kSharedFileTokenBytes) {
    throw std::runtime_error("rank 0's offer of the segment is malformed ('" + text + "')");
  }
  for (size_t i = 0; i < token.size(); i += 2) {
    offer.token += static_cast<char>(std::stoi(token.substr(i, 2), nullptr, 16));
  }
  return offer;
}

constexpr const char* kSegmentOk = "ok";

}  // namespace

// What rank 0 offers when it makes no segment, so that no peer waits for one.
const char* const ProcessGroupGrpc::kNoSegment = "none";

bool ProcessGroupGrpc::wants_segment() const {
  // The layout is unknown when a peer failed to start (nothing was connected):
  // the group fails then anyway, and wants no segment.
  return size_ > 1 && options_.transport.shared_memory && options_.transport.unix_sockets &&
         hosts_.world() == size_ && static_cast<int>(hosts_.local_ranks(rank_).size()) == size_;
}

std::string ProcessGroupGrpc::map_segment(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix) {
  const uint32_t world = static_cast<uint32_t>(size_);
  const uint64_t slot_bytes = options_.chunk_bytes;
  try {
    if (rank_ == 0) {
      Segment segment = Segment::create(world, slot_bytes);
      store_set(store, prefix + "segment", offer_text(segment.offer()));
      segment_ = std::make_unique<SegmentGroup>(std::move(segment), 0);
      return "";
    }
    store->wait({prefix + "segment"}, options_.transport.connect_timeout);
    const std::string offered = store_string(store, prefix + "segment");
    if (offered == kNoSegment) return "rank 0 made no segment";
    const SharedFileOffer offer = parse_offer(offered);
    // The store is writable by more than the ranks: the file must be one of
    // the process at the other end of this rank's link to rank 0.
    const std::optional<uint32_t> rank0 = messenger_->peer_pid(0);
    if (!rank0 || *rank0 != offer.pid) {
      return "the segment offered in the store belongs to process " + std::to_string(offer.pid) +
             ", not to rank 0's (" + (rank0 ? std::to_string(*rank0) : std::string("unknown")) + ")";
    }
    segment_ = std::make_unique<SegmentGroup>(Segment::open(offer, world, slot_bytes), static_cast<uint32_t>(rank_));
    return "";
  } catch (const std::exception& e) {
    segment_.reset();
    return e.what();
  }
}

void ProcessGroupGrpc::report_segment(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                      const std::string& outcome) {
  store_set(store, prefix + "segment/" + std::to_string(rank_), outcome.empty() ? kSegmentOk : outcome);
}

void ProcessGroupGrpc::decide_segment(const std::vector<std::optional<std::string>>& reports) {
  // Every rank reported before its setup outcome, which every rank has seen by
  // now: each reads the same reports and decides alike.
  std::string refused;
  for (int r = 0; r < size_ && refused.empty(); ++r) {
    // A rank that reports no segment at all (one that runs another protocol)
    // declines it.
    const std::optional<std::string>& outcome = reports.at(r);
    if (!outcome) refused = "rank " + std::to_string(r) + " did not report whether it mapped the segment";
    else if (*outcome != kSegmentOk) refused = "rank " + std::to_string(r) + ": " + *outcome;
  }
  if (refused.empty()) return;
  segment_.reset();
  if (rank_ == 0) {
    log_warning("process group '" + options_.group_name + "' runs without a shared memory segment (" + refused +
                "); its small collectives go through the links instead, which is slower. Set "
                "TORCH_GRPC_PG_SHARED_MEMORY=0 to stop trying.");
  }
}

SegmentWait ProcessGroupGrpc::segment_wait(const OpDescriptor& op, std::chrono::milliseconds timeout) const {
  GroupTransport* messenger = messenger_.get();
  SegmentWait wait;
  wait.deadline = std::chrono::steady_clock::now() + timeout;
  wait.failure = [messenger] { return messenger->failed() ? messenger->failure() : std::string(); };
  wait.slow_wait = [messenger, op](uint32_t peer) {
    messenger->monitor().begin_wait(static_cast<int>(peer), op_name(op.op), op.seq, 0);
  };
  wait.slow_wait_over = [messenger] { messenger->monitor().end_wait(); };
  return wait;
}

void ProcessGroupGrpc::count_segment_bytes(size_t sent, size_t received) const {
  GroupMonitor& monitor = messenger_->monitor();
  monitor.sent(sent, /*through_shared_ring=*/true);
  monitor.received(received);
}

OpDescriptor ProcessGroupGrpc::descriptor(OpType op, uint64_t seq, DType dtype, uint64_t count, uint32_t root,
                                          const std::optional<Reduction>& reduction) {
  OpDescriptor d;
  d.seq = seq;
  d.op = static_cast<uint32_t>(op);
  d.dtype = static_cast<uint32_t>(dtype);
  d.count = count;
  d.root = root;
  d.reduction = reduction_code(reduction);
  return d;
}

}  // namespace tgpg
