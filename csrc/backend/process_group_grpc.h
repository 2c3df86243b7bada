#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/collective.h"
#include "algorithms/collectives.h"
#include "backend/group_state.h"
#include "backend/grpc_work.h"
#include "backend/host_staging.h"
#include "backend/op_queue.h"
#include "backend/p2p_lanes.h"
#include "same_host/segment_group.h"
#include "transport/group_transport.h"
#include "transport/transport_config.h"

namespace tgpg {

struct BackendOptions {
  TransportConfig transport;
  size_t chunk_bytes = 2 << 20;        // ring pipelining granularity
  size_t direct_max_bytes = 64 << 10;  // at or below: one round trip to every peer instead of the ring
  // What float32 all_reduce, reduce_scatter, all_gather and broadcast send as
  // on links between hosts: Float32 (as they are), BFloat16 or Float16.
  DType wire_dtype = DType::Float32;
  // Whether allreduce runs in two levels (inside each host, then across) when
  // the group spans hosts of equally many ranks; off: one flat ring.
  bool two_level = true;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string group_name;
};

// The c10d backend "grpc": turns torch's collective calls into jobs on one
// worker thread that run the ring algorithms over the gRPC transport.
//
// Its lifecycle (Initializing -> Ready -> Failed(reason) -> Destroyed: how a
// setup fails together on every rank, how a failure reaches peers, what a
// failed group does with later calls, and how destroy stays bounded) is
// written down in backend/group_state.h.
class ProcessGroupGrpc : public c10d::Backend {
 public:
  ProcessGroupGrpc(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, BackendOptions options);
  ~ProcessGroupGrpc() override;

  const std::string getBackendName() const override { return "grpc"; }
  // Declared by c10d::Backend in recent releases only (not in 2.7); Python
  // reads `options` instead (torch_grpc_pg/__init__.py).
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 9
  c10::intrusive_ptr<Options> getBackendOptions() override;
#else
  c10::intrusive_ptr<Options> getBackendOptions();
#endif
  // Where peers reach this rank: "host:port", and the unix socket ("" if off).
  std::string tcp_address() const;
  std::string unix_socket() const;
  // The key that names this group instance in every link handshake. It is
  // published in the store, so it is no secret; tools and tests use it.
  std::string group_key() const { return messenger_->group_key(); }
  // Why the group failed, or "" while it is usable (or was destroyed without failing).
  // Includes a failure the transport saw on its own (a peer's death or abort) before any
  // call noticed it: torchft polls this between steps (torch_grpc_pg/torchft.py).
  std::string failure() const;
  // c10d::Backend declares setTimeout from torch 2.9 on; before, it is this class's own.
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 9
  void setTimeout(std::chrono::milliseconds timeout) override;
#else
  void setTimeout(std::chrono::milliseconds timeout);
#endif
  // The sequence number of the last collective issued (0 before the first).
  uint64_t getSequenceNumberForGroup() override { return queue_.last_seq(); }
  void setSequenceNumberForGroup() override {}

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  // A sparse COO tensor, summed as gloo sums it (sparse_allreduce.cc): an
  // all_gather of every rank's nnz and sizes, then of its indices and values.
  // allreduce() sends sparse CPU tensors here; torch sends sparse CUDA ones.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
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

  // Coalesced forms: one collective per tensor, issued together; jobs run in
  // order, so the Work returned (the last one's) completes after all of them.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  // Ops issued between these run as they are issued; endCoalescing's Work
  // completes once all of them have.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // Point-to-point, on streams and threads apart from the collectives' (p2p_lanes.h).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Destroyed: fails queued and running work, then closes the transport;
  // bounded, and safe to call more than once and from any thread.
  void shutdown() override;
  // Failed ("aborted on rank r", sent on to peers), then Destroyed.
  void abort() override;

 private:
  using Body = std::function<void(uint64_t seq, std::chrono::milliseconds timeout)>;

  // Issues `body` on the worker thread and returns its Work at once; with
  // `here` (see run_here()), runs it on the calling thread instead when no
  // other job is queued or running.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title,
                                         const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                         Body body, bool here = false);
  // The same on any queue: the collectives' or a point-to-point lane, whose
  // ops `transport` records.
  c10::intrusive_ptr<c10d::Work> issue(OpQueue& queue, GroupTransport& transport,
                                       const c10::intrusive_ptr<GrpcWork>& work, const char* title,
                                       const std::vector<at::Tensor>& inputs, std::chrono::milliseconds timeout,
                                       Body body, bool here = false);
  // Whether a collective may run on the calling thread: its caller waits for
  // it at once (async_op=False) and its tensor is in host memory (a CUDA
  // tensor's staging waits on its stream on the worker). No op needs the
  // group's worker: in the shared segment the ranks need no thread but their
  // own, and over gRPC a send goes out from whichever thread makes it while
  // the server's threads receive. The two thread hand-offs this saves are most
  // of a small op's time: a 4 KiB allreduce in the segment
  // (benchmarks/one_host.py), a fifth of a 4 B allreduce between two ranks
  // over TCP (benchmarks/RESULTS.md).
  static bool run_here(bool waited_at_once, const at::Tensor& tensor) { return waited_at_once && tensor.is_cpu(); }
  // Point-to-point helpers (p2p_calls.cc).
  void check_peer(int peer, const std::string& where, const char* role) const;
  // Takes the next message from `src` into `stage`; source_lock(src) held.
  void receive_message(int src, int tag, const std::string& where, HostStage& stage, std::chrono::milliseconds timeout);
  // Lets `c`, a float32 op of the four that take wire_dtype, narrow its chunks
  // on links between hosts.
  void narrow_between_hosts(Collective& c) const;
  // Whether narrow_between_hosts() narrows an op on `dtype` in this group.
  bool narrows_between_hosts(DType dtype) const;
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
  // alltoall between packed host tensors: block `send[j]` of `in` goes to rank
  // j, block `recv[i]` of `out` comes from rank i; `unpack` writes results out.
  // An all_gather of uneven sizes is such an exchange too, under its own name.
  struct Exchange {
    OpType op = OpType::Alltoall;
    c10d::OpType type = c10d::OpType::ALLTOALL;
    const char* title = "grpc:all_to_all";
  };
  c10::intrusive_ptr<c10d::Work> alltoall_packed(at::Tensor in, std::vector<Block> send, at::Tensor out,
                                                 std::vector<Block> recv, const std::vector<at::Tensor>& inputs,
                                                 std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                                                 const std::string& where, std::function<void(const at::Tensor&)> unpack,
                                                 Exchange exchange);
  // all_gather where the output tensors differ in size (NCCL allows it): each
  // rank sends its whole input to every peer, and each pair checks the size.
  c10::intrusive_ptr<c10d::Work> allgather_uneven(std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs,
                                                  const c10d::AllgatherOptions& opts, const std::string& where);
  void rendezvous(const c10::intrusive_ptr<c10d::Store>& store);
  // The shared segment (segment_setup.cc): wanted when every rank lives on
  // this host; mapped during rendezvous ("" when this rank has it, else why
  // not), reported, and kept only if every rank reported it mapped.
  bool wants_segment() const;
  std::string map_segment(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix);
  void report_segment(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                      const std::string& outcome);
  // From every rank's report of the segment, in rank order (none: no report).
  void decide_segment(const std::vector<std::optional<std::string>>& reports);
  static const char* const kNoSegment;
  // Whether a collective of `bytes` (per rank) runs in the segment.
  bool on_segment(size_t bytes) const { return segment_ && bytes <= kSegmentMaxBytes; }
  // How an op waits in the segment: its deadline, the group's failure, and
  // what the status tool shows of a long wait.
  SegmentWait segment_wait(const OpDescriptor& op, std::chrono::milliseconds timeout) const;
  // What an op moved through the segment, in the counters the status tool shows.
  void count_segment_bytes(size_t sent, size_t received) const;
  static OpDescriptor descriptor(OpType op, uint64_t seq, DType dtype, uint64_t count, uint32_t root = 0,
                                 const std::optional<Reduction>& reduction = std::nullopt);
  // Collectives of at most this many bytes per rank run in the segment.
  static constexpr size_t kSegmentMaxBytes = size_t{1} << 62;
  void publish_server(const c10::intrusive_ptr<c10d::Store>& store) const;
  // Waits until `deadline` for every peer's address and connects to it; returns
  // why not, or "". Marks in `absent` the ranks that published no address (those
  // marked already are not waited for).
  std::string connect_peers(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                            std::vector<bool>& absent, std::chrono::steady_clock::time_point deadline);

  // The worker's part of a job that uses this object; returns what completes its Work.
  struct OpSummary {
    std::string dtype;  // of the first input
    uint64_t count;     // its elements
  };
  OpQueue::Finish run_job(GroupTransport& transport, const c10::intrusive_ptr<GrpcWork>& work, const char* title,
                          uint64_t seq, std::chrono::milliseconds timeout, const OpSummary& summary, const Body& body);
  // Ready -> Failed(reason). Only the first call acts: it fails the transport,
  // tells peers if the transport did not know yet, and closes the queue. The
  // queued jobs' cancellations come back, to be run outside the run part.
  OpQueue::Cancelled enter_failed(const std::string& reason);
  // Why new work cannot run now, for the messages of refused jobs.
  std::string unusable_reason() const;

  BackendOptions options_;
  // The group's default op timeout; setTimeout() may change it while jobs run.
  std::atomic<std::chrono::milliseconds::rep> timeout_ms_{0};
  GroupState state_;
  // Shared with each other's failure listeners, which hold them weakly.
  std::shared_ptr<GroupTransport> messenger_;
  std::shared_ptr<GroupTransport> p2p_;  // point-to-point messages, on streams of their own
  // Which ranks share a host; set once the peers' endpoints are known, before any op.
  HostLayout hosts_;
  // What allreduce schedules by: hosts_, or no layout (a flat ring) with two_level off.
  HostLayout allreduce_hosts_;
  // The group's shared segment, when every rank lives on this host and mapped it.
  std::unique_ptr<SegmentGroup> segment_;
  // By rank: on another host than this rank (from hosts_), for wire_dtype.
  std::vector<bool> remote_;
  // Ops issued between startCoalescing and endCoalescing.
  std::mutex coalescing_mutex_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> coalesced_;
  // Last: destroyed first, so their workers have left every job that uses
  // the members above before they go.
  P2PLanes lanes_;
  OpQueue queue_;
};

}  // namespace tgpg
