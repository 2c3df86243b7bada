// Point-to-point: send, recv and recv from any source. Each message travels
// on the group's second transport (its own streams), and each op runs on a
// lane of its own (p2p_lanes.h), so a receive that waits for one peer holds
// up neither sends, nor other peers, nor collectives. A message carries its
// number between the two ranks, its dtype, size and tag, and a receive checks
// all four: a receive that does not match the send fails the group on every
// rank instead of filling a tensor with the wrong bytes.
#include <c10/util/Exception.h>

#include <thread>

#include "algorithms/collective_error.h"
#include "algorithms/collectives.h"
#include "backend/process_group_grpc.h"
#include "backend/tensor_checks.h"
#include "backend/type_mapping.h"

namespace tgpg {
namespace {

// A receive from any source that finds its peer's next message being taken
// by a receive from that very peer looks again after this pause.
constexpr std::chrono::milliseconds kAnySourceRetry{1};

const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, const std::string& where) {
  TORCH_CHECK(tensors.size() == 1, where, ": expected one tensor, got ", tensors.size(), ".");
  check_dense(tensors[0], where);
  return tensors[0];
}

}  // namespace

void ProcessGroupGrpc::check_peer(int peer, const std::string& where, const char* role) const {
  TORCH_CHECK(peer >= 0 && peer < size_, where, ": the ", role, " rank ", peer, " is not in [0, ", size_, ").");
  TORCH_CHECK(peer != rank_, where, ": the ", role, " rank is this rank; a message needs another rank of the group.");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  const std::string where = this->where("send") + " to rank " + std::to_string(dst_rank);
  check_peer(dst_rank, where, "destination");
  const at::Tensor& tensor = single_tensor(tensors, where);
  const DType dtype = to_dtype(tensor.scalar_type(), where);
  const auto count = static_cast<uint64_t>(tensor.numel());
  auto stage = std::make_shared<HostStage>(tensor, /*copy_in=*/true);
  auto work = c10::make_intrusive<GrpcWork>(rank_, c10d::OpType::SEND, "grpc:send", tensors, std::vector<at::Tensor>{});
  return issue(lanes_.send_lane(dst_rank), *p2p_, work, "grpc:send", tensors, timeout_of(c10d::kUnsetTimeout),
               [this, stage, dtype, count, dst_rank, tag, where](uint64_t message, std::chrono::milliseconds timeout) {
                 stage->wait_ready();
                 Collective c(*p2p_, rank_, size_, OpType::PointToPoint, message, dtype, count, timeout,
                              options_.chunk_bytes, std::make_shared<SendTracker>(keep_alive({stage->host()})));
                 c.use_tag(tag);
                 try {
                   send_message(c, dst_rank, stage->data());
                   c.wait_sends_released();
                 } catch (const CollectiveError& e) {
                   throw CollectiveError(where + ": " + e.what());
                 }
               });
}

void ProcessGroupGrpc::receive_message(int src, int tag, const std::string& where, HostStage& stage,
                                       std::chrono::milliseconds timeout) {
  const at::Tensor& host = stage.host();
  Collective c(*p2p_, rank_, size_, OpType::PointToPoint, lanes_.next_message_from(src),
               to_dtype(host.scalar_type(), where), static_cast<uint64_t>(host.numel()), timeout,
               options_.chunk_bytes, std::make_shared<SendTracker>(nullptr));
  c.use_tag(tag);
  stage.wait_ready();
  try {
    recv_message(c, src, stage.data());
  } catch (const CollectiveError& e) {
    throw CollectiveError(where + ": " + e.what());
  }
  stage.write_back();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  const std::string where = this->where("recv") + " from rank " + std::to_string(src_rank);
  check_peer(src_rank, where, "source");
  const at::Tensor& tensor = single_tensor(tensors, where);
  check_output(tensor, where);
  to_dtype(tensor.scalar_type(), where);
  auto stage = std::make_shared<HostStage>(tensor, /*copy_in=*/false);
  auto work = c10::make_intrusive<GrpcWork>(rank_, c10d::OpType::RECV, "grpc:recv", tensors, tensors);
  work->set_source_rank(src_rank);
  return issue(lanes_.recv_lane(src_rank), *p2p_, work, "grpc:recv", tensors, timeout_of(c10d::kUnsetTimeout),
               [this, stage, src_rank, tag, where](uint64_t, std::chrono::milliseconds timeout) {
                 std::lock_guard<std::mutex> lock(lanes_.source_lock(src_rank));
                 receive_message(src_rank, tag, where, *stage, timeout);
               });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const std::string where = this->where("recv") + " from any source";
  TORCH_CHECK(size_ > 1, where, ": a group of one rank has no other rank to receive from.");
  const at::Tensor& tensor = single_tensor(tensors, where);
  check_output(tensor, where);
  to_dtype(tensor.scalar_type(), where);
  auto stage = std::make_shared<HostStage>(tensor, /*copy_in=*/false);
  auto work = c10::make_intrusive<GrpcWork>(rank_, c10d::OpType::RECVANYSOURCE, "grpc:recv_anysource",
                                            tensors, tensors);
  return issue(lanes_.any_source_lane(), *p2p_, work, "grpc:recv_anysource", tensors,
               timeout_of(c10d::kUnsetTimeout),
               [this, stage, tag, where, work](uint64_t, std::chrono::milliseconds timeout) {
                 const Deadline deadline = std::chrono::steady_clock::now() + timeout;
                 for (;;) {
                   int src;
                   try {
                     src = p2p_->wait_any_source(deadline);
                   } catch (const PeerTimeout&) {
                     throw CollectiveError(where + " timed out after " + std::to_string(timeout.count()) +
                                           " ms: no rank sent this rank a message. If the sender is only slow, "
                                           "raise the process group timeout.");
                   } catch (const CollectiveError& e) {
                     throw CollectiveError(where + ": " + e.what());
                   }
                   // A receive from that peer by name may be taking this very message.
                   std::unique_lock<std::mutex> lock(lanes_.source_lock(src), std::try_to_lock);
                   if (lock.owns_lock() && p2p_->has_frame(src)) {
                     receive_message(src, tag, where + " (rank " + std::to_string(src) + ")", *stage,
                                     std::chrono::duration_cast<std::chrono::milliseconds>(
                                         deadline - std::chrono::steady_clock::now()));
                     work->set_source_rank(src);
                     return;
                   }
                   if (lock.owns_lock()) lock.unlock();
                   std::this_thread::sleep_for(kAnySourceRetry);
                 }
               });
}

}  // namespace tgpg
