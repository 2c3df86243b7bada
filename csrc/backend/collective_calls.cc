// The collectives that DDP and most training code use: allreduce, broadcast,
// allgather and barrier. Each checks its arguments on the calling thread,
// stages tensors in host memory, and queues the algorithm for the worker.
#include <c10/util/Exception.h>

#include "algorithms/collectives.h"
#include "backend/blocking_call.h"
#include "backend/host_staging.h"
#include "backend/process_group_grpc.h"
#include "backend/tensor_checks.h"
#include "backend/type_mapping.h"

namespace tgpg {

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const std::string where = this->where("allreduce");
  TORCH_CHECK(tensors.size() == 1, where, ": expected one tensor, got ", tensors.size(),
              "; use all_reduce_coalesced for several.");
  const at::Tensor& tensor = tensors[0];
  // torch routes sparse CPU tensors here, and sparse CUDA ones to allreduce_sparse.
  if (tensor.layout() == at::kSparse) return allreduce_sparse(tensors, opts);
  check_output(tensor, where);
  const DType dtype = to_dtype(tensor.scalar_type(), where);
  const TorchReduction reduce_op = to_reduction(opts.reduceOp, dtype, where);
  auto stage = std::make_shared<HostStage>(tensor, /*copy_in=*/true);
  const auto count = static_cast<uint64_t>(tensor.numel());
  const size_t bytes = count * element_size(dtype);
  return enqueue(
      c10d::OpType::ALLREDUCE, "grpc:all_reduce", tensors, tensors, timeout_of(opts.timeout),
      [this, stage, dtype, reduce_op, count, bytes](uint64_t seq, std::chrono::milliseconds timeout) {
        stage->wait_ready();
        premultiply(stage->host(), reduce_op);
        if (on_segment(bytes)) {
          const OpDescriptor d = descriptor(OpType::Allreduce, seq, dtype, count, 0, reduce_op.reduction);
          segment_->allreduce(stage->data(), count, dtype, reduce_op.reduction.op, d, segment_wait(d, timeout));
          count_segment_bytes(bytes, bytes);
        } else {
          Collective c = collective(OpType::Allreduce, seq, dtype, count, timeout, keep_alive({stage->host()}),
                                    /*root=*/0, reduce_op.reduction);
          narrow_between_hosts(c);
          tgpg::allreduce(c, stage->data(), options_.direct_max_bytes, allreduce_hosts_);
          c.wait_sends_released();
        }
        if (reduce_op.reduction.average) stage->host().div_(size_);
        stage->write_back();
      },
      run_here(waited_at_once(opts), tensor));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const std::string where = this->where("allreduce_coalesced");
  TORCH_CHECK(!tensors.empty(), where, ": expected at least one tensor.");
  for (const auto& t : tensors) {
    check_output(t, where);
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type() && t.device() == tensors[0].device(), where,
                ": all tensors must share one dtype and device; got ", tensors[0].scalar_type(), " on ",
                tensors[0].device(), " and ", t.scalar_type(), " on ", t.device(), ".");
  }
  const DType dtype = to_dtype(tensors[0].scalar_type(), where);
  const TorchReduction reduce_op = to_reduction(opts.reduceOp, dtype, where);
  std::vector<at::Tensor> flat_views;
  flat_views.reserve(tensors.size());
  for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
  at::Tensor packed = at::cat(flat_views).to(at::kCPU);
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "grpc:all_reduce_coalesced", tensors, tensors,
                 timeout_of(opts.timeout),
                 [this, packed, tensors, dtype, reduce_op](uint64_t seq, std::chrono::milliseconds timeout) mutable {
                   premultiply(packed, reduce_op);
                   Collective c = collective(OpType::AllreduceCoalesced, seq, dtype,
                                             static_cast<uint64_t>(packed.numel()), timeout, keep_alive({packed}),
                                             /*root=*/0, reduce_op.reduction);
                   narrow_between_hosts(c);
                   tgpg::allreduce(c, static_cast<std::byte*>(packed.data_ptr()), options_.direct_max_bytes,
                                   allreduce_hosts_);
                   c.wait_sends_released();
                   if (reduce_op.reduction.average) packed.div_(size_);
                   int64_t offset = 0;
                   for (auto& t : tensors) {
                     copy_into(t, packed.narrow(0, offset, t.numel()));
                     offset += t.numel();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const std::string where = this->where("broadcast");
  TORCH_CHECK(tensors.size() == 1, where, ": expected one tensor, got ", tensors.size(), ".");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, where, ": root rank ", opts.rootRank,
              " is not in [0, ", size_, ").");
  const at::Tensor& tensor = tensors[0];
  const DType dtype = to_dtype(tensor.scalar_type(), where);
  // Only the other ranks write into it, unless float32 goes to other hosts
  // narrowed: then the root keeps the rounded values that they receive.
  const bool root_writes = narrows_between_hosts(dtype);
  if (rank_ == opts.rootRank && !root_writes) check_dense(tensor, where);
  else check_output(tensor, where);
  const auto root = static_cast<uint32_t>(opts.rootRank);
  auto stage = std::make_shared<HostStage>(tensor, /*copy_in=*/rank_ == opts.rootRank);
  const auto count = static_cast<uint64_t>(tensor.numel());
  const size_t bytes = count * element_size(dtype);
  return enqueue(
      c10d::OpType::BROADCAST, "grpc:broadcast", tensors, tensors, timeout_of(opts.timeout),
      [this, stage, dtype, count, root, bytes, root_writes](uint64_t seq, std::chrono::milliseconds timeout) {
        stage->wait_ready();
        if (on_segment(bytes)) {
          const OpDescriptor d = descriptor(OpType::Broadcast, seq, dtype, count, root);
          segment_->broadcast(stage->data(), bytes, root, d, segment_wait(d, timeout));
          const bool root_here = static_cast<uint32_t>(rank_) == root;
          count_segment_bytes(root_here ? bytes : 0, root_here ? 0 : bytes);
        } else {
          Collective c = collective(OpType::Broadcast, seq, dtype, count, timeout, keep_alive({stage->host()}), root);
          narrow_between_hosts(c);
          tgpg::broadcast(c, stage->data(), options_.direct_max_bytes);
          c.wait_sends_released();
        }
        if (static_cast<uint32_t>(rank_) != root || root_writes) stage->write_back();
      },
      run_here(waited_at_once(opts), tensor));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  const std::string where = this->where("allgather");
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, where,
              ": expected one input tensor and one list of outputs.");
  const at::Tensor& input = inputs[0];
  std::vector<at::Tensor> outs = outputs[0];
  check_dense(input, where);
  TORCH_CHECK(static_cast<int>(outs.size()) == size_, where, ": expected ", size_, " output tensors, got ",
              outs.size(), ".");
  bool uneven = false;
  for (const auto& o : outs) {
    check_output(o, where);
    check_same_dtype(input, o, where, "output tensor");
    uneven = uneven || o.numel() != input.numel();
  }
  // The output tensors give each rank's size, so every rank takes the same path.
  if (uneven) return allgather_uneven(inputs, outs, opts, where);
  const DType dtype = to_dtype(input.scalar_type(), where);
  auto in = std::make_shared<HostStage>(input, /*copy_in=*/true);
  const int64_t n = input.numel();
  at::Tensor gathered = at::empty({size_ * n}, input.options().device(at::kCPU));
  const size_t bytes = static_cast<size_t>(n) * element_size(dtype);
  return enqueue(
      c10d::OpType::ALLGATHER, "grpc:all_gather", inputs, outs, timeout_of(opts.timeout),
      [this, in, gathered, outs, dtype, n, bytes](uint64_t seq, std::chrono::milliseconds timeout) mutable {
        in->wait_ready();
        if (on_segment(bytes)) {
          const OpDescriptor d = descriptor(OpType::Allgather, seq, dtype, static_cast<uint64_t>(n));
          segment_->allgather(in->data(), static_cast<std::byte*>(gathered.data_ptr()), bytes, d,
                              segment_wait(d, timeout));
          count_segment_bytes(bytes, bytes * (size_ - 1));
        } else {
          gathered.narrow(0, rank_ * n, n).copy_(in->host().reshape({-1}));
          Collective c =
              collective(OpType::Allgather, seq, dtype, static_cast<uint64_t>(n), timeout, keep_alive({gathered}));
          narrow_between_hosts(c);
          tgpg::allgather(c, static_cast<std::byte*>(gathered.data_ptr()));
          c.wait_sends_released();
        }
        for (int r = 0; r < size_; ++r) copy_into(outs[r], gathered.narrow(0, r * n, n));
      },
      run_here(waited_at_once(opts), input) && outs[0].is_cpu());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  const std::string where = this->where("allgather_into_tensor");
  check_dense(input, where);
  check_output(output, where);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), where, ": output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type(), ".");
  TORCH_CHECK(output.numel() == size_ * input.numel(), where, ": output must have world_size * ",
              input.numel(), " = ", size_ * input.numel(), " elements, got ", output.numel(), ".");
  const DType dtype = to_dtype(input.scalar_type(), where);
  auto in = std::make_shared<HostStage>(input, /*copy_in=*/true);
  auto out = std::make_shared<HostStage>(output, /*copy_in=*/false);
  const int64_t n = input.numel();
  const size_t bytes = static_cast<size_t>(n) * element_size(dtype);
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, "grpc:all_gather_into_tensor", {input}, {output}, timeout_of(opts.timeout),
      [this, in, out, dtype, n, bytes](uint64_t seq, std::chrono::milliseconds timeout) {
        in->wait_ready();
        if (on_segment(bytes)) {
          const OpDescriptor d = descriptor(OpType::Allgather, seq, dtype, static_cast<uint64_t>(n));
          segment_->allgather(in->data(), out->data(), bytes, d, segment_wait(d, timeout));
          count_segment_bytes(bytes, bytes * (size_ - 1));
        } else {
          at::Tensor flat = out->host().view({-1});
          flat.narrow(0, rank_ * n, n).copy_(in->host().reshape({-1}));
          Collective c =
              collective(OpType::Allgather, seq, dtype, static_cast<uint64_t>(n), timeout, keep_alive({out->host()}));
          narrow_between_hosts(c);
          tgpg::allgather(c, out->data());
          c.wait_sends_released();
        }
        out->write_back();
      },
      run_here(waited_at_once(opts), input) && output.is_cpu());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const std::string where = this->where("allgather_into_tensor_coalesced");
  TORCH_CHECK(outputs.size() == inputs.size(), where, ": got ", inputs.size(), " inputs but ", outputs.size(),
              " outputs.");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  // Jobs run in order, so the last one completing means all have.
  return works.empty() ? barrier(c10d::BarrierOptions()) : works.back();
}

// torch's layout, as gloo's: one list per rank, each holding one tensor per
// input (outputs[rank][i] receives input i of that rank). Each input runs as
// an all_gather of its own, into {outputs[0][i], ..., outputs[world-1][i]}.
c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions& opts) {
  const std::string where = this->where("allgather_coalesced");
  TORCH_CHECK(!inputs.empty(), where, ": expected at least one input tensor.");
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_, where, ": expected one list of output tensors per rank (",
              size_, "), got ", outputs.size(), " lists; output_tensor_lists[r][i] receives input i of rank r.");
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), where, ": the output list for rank ", r, " holds ",
                outputs[r].size(), " tensors; it needs one per input tensor (", inputs.size(), ").");
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& out = outputs[r][i];
      TORCH_CHECK(out.scalar_type() == inputs[i].scalar_type() && out.sizes() == inputs[i].sizes(), where,
                  ": output tensor ", i, " for rank ", r, " is ", out.scalar_type(), out.sizes(),
                  " but input tensor ", i, " is ", inputs[i].scalar_type(), inputs[i].sizes(),
                  "; each must match its input in dtype and shape.");
    }
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> per_rank(1);
    per_rank[0].reserve(size_);
    for (int r = 0; r < size_; ++r) per_rank[0].push_back(outputs[r][i]);
    std::vector<at::Tensor> in{inputs[i]};
    works.push_back(allgather(per_rank, in, opts));
  }
  // Jobs run in order, so the last one completing means all have.
  return works.back();
}

// Ops issued while coalescing run as they are issued; the Work of the batch
// waits on all their futures.
void ProcessGroupGrpc::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescing_mutex_);
  TORCH_CHECK(!coalescing_, where("startCoalescing"), ": already coalescing; call endCoalescing first.");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    TORCH_CHECK(coalescing_, where("endCoalescing"), ": startCoalescing was not called.");
    coalescing_ = false;
    futures.swap(coalesced_);
  }
  auto work = c10::make_intrusive<GrpcWork>(rank_, c10d::OpType::COALESCED, "grpc:coalesced",
                                            std::vector<at::Tensor>{}, std::vector<at::Tensor>{});
  if (futures.empty()) {
    work->complete();
    return work;
  }
  c10::List<c10::intrusive_ptr<c10::ivalue::Future>> list(c10::FutureType::create(c10::AnyType::get()));
  for (auto& future : futures) list.push_back(future);
  c10::collectAll(list)->addCallback([work, futures](c10::ivalue::Future&) {
    for (const auto& future : futures) {
      if (future->hasError()) {
        work->fail(future->exception_ptr());
        return;
      }
    }
    work->complete();
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(
      c10d::OpType::BARRIER, "grpc:barrier", {}, {}, timeout_of(opts.timeout),
      [this](uint64_t seq, std::chrono::milliseconds timeout) {
        if (on_segment(0)) {
          const OpDescriptor d = descriptor(OpType::Barrier, seq, DType::UInt8, 0);
          segment_->barrier(d, segment_wait(d, timeout));
          return;
        }
        Collective c = collective(OpType::Barrier, seq, DType::UInt8, 0, timeout, nullptr);
        tgpg::barrier(c);
      },
      waited_at_once(opts));
}

}  // namespace tgpg
