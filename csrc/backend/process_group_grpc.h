#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/collective.h"
#include "backend/grpc_work.h"
#include "backend/op_queue.h"
#include "transport/group_transport.h"
#include "transport/transport_config.h"

namespace tgpg {

struct BackendOptions {
  TransportConfig transport;
  size_t chunk_bytes = 2 << 20;        // ring pipelining granularity
  size_t direct_max_bytes = 64 << 10;  // at or below: one round trip to every peer instead of the ring
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string group_name;
};

// The c10d backend "grpc": turns torch's collective calls into jobs on one
// worker thread that run the ring algorithms over the gRPC transport.
class ProcessGroupGrpc : public c10d::Backend {
 public:
  ProcessGroupGrpc(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, BackendOptions options);
  ~ProcessGroupGrpc() override;

  const std::string getBackendName() const override { return "grpc"; }
  // Where peers reach this rank: "host:port", and the unix socket ("" if off).
  std::string tcp_address() const;
  std::string unix_socket() const;
  // The key that names this group instance in every link handshake. It is
  // published in the store, so it is no secret; tools and tests use it.
  std::string group_key() const { return messenger_->group_key(); }
  void setTimeout(std::chrono::milliseconds timeout) override { options_.timeout = timeout; }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  void setSequenceNumberForGroup() override {}

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  void shutdown() override;
  void abort() override;

 private:
  using Body = std::function<void(uint64_t seq, std::chrono::milliseconds timeout)>;

  // Issues `body` on the worker thread and returns its Work at once.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title,
                                         const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                         Body body);
  Collective collective(OpType op, uint64_t seq, DType dtype, uint64_t count,
                        std::chrono::milliseconds timeout, std::shared_ptr<void> keepalive,
                        uint32_t root = 0, std::optional<Reduction> reduction = std::nullopt);
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds requested) const;
  std::string where(const char* op) const;
  void check_root(int64_t root, const std::string& where) const;
  // reduce_scatter on a packed host copy of world blocks; block `rank` goes to `output`.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_packed(at::Tensor packed, at::Tensor output,
                                                       const std::vector<at::Tensor>& inputs,
                                                       const c10d::ReduceScatterOptions& opts,
                                                       const std::string& where);
  // alltoall of equal blocks between packed host tensors; `unpack` writes results out.
  c10::intrusive_ptr<c10d::Work> alltoall_packed(at::Tensor in, at::Tensor out, const std::vector<at::Tensor>& inputs,
                                                 std::vector<at::Tensor> outputs, const c10d::AllToAllOptions& opts,
                                                 const std::string& where, std::function<void(const at::Tensor&)> unpack);
  void rendezvous(const c10::intrusive_ptr<c10d::Store>& store);

  BackendOptions options_;
  std::unique_ptr<GroupTransport> messenger_;
  std::atomic<uint64_t> seq_{0};
  OpQueue queue_;
};

}  // namespace tgpg
