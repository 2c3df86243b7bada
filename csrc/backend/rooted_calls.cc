// The remaining collectives: reduce, gather, scatter, reduce_scatter,
// alltoall, and all_gather of uneven sizes. They work on packed host copies,
// which keeps the user's inputs untouched where torch promises that.
#include <c10/util/Exception.h>

#include "algorithms/collectives.h"
#include "backend/blocking_call.h"
#include "backend/host_staging.h"
#include "backend/process_group_grpc.h"
#include "backend/tensor_checks.h"
#include "backend/type_mapping.h"

namespace tgpg {
namespace {

// One contiguous CPU tensor holding `tensors` back to back, never aliasing them.
at::Tensor pack(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat).to(at::kCPU);
}

at::Tensor private_cpu_copy(const at::Tensor& t) {
  return t.reshape({-1}).to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

std::byte* bytes_of(const at::Tensor& t) { return static_cast<std::byte*>(t.data_ptr()); }

}  // namespace

void ProcessGroupGrpc::check_root(int64_t root, const std::string& where) const {
  TORCH_CHECK(root >= 0 && root < size_, where, ": root rank ", root, " is not in [0, ", size_, ").");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const std::string where = this->where("reduce");
  TORCH_CHECK(tensors.size() == 1, where, ": expected one tensor, got ", tensors.size(), ".");
  check_root(opts.rootRank, where);
  const at::Tensor& tensor = tensors[0];
  const bool is_root = opts.rootRank == rank_;
  if (is_root) check_output(tensor, where);
  else check_dense(tensor, where);
  const DType dtype = to_dtype(tensor.scalar_type(), where);
  const TorchReduction reduce_op = to_reduction(opts.reduceOp, dtype, where);
  // Only the root's tensor may change: the others reduce a private copy.
  auto stage = std::make_shared<HostStage>(tensor, /*copy_in=*/true);
  const auto root = static_cast<uint32_t>(opts.rootRank);
  const auto count = static_cast<uint64_t>(tensor.numel());
  return enqueue(c10d::OpType::REDUCE, "grpc:reduce", tensors, tensors, timeout_of(opts.timeout),
                 [this, stage, dtype, reduce_op, count, root, is_root](uint64_t seq,
                                                                      std::chrono::milliseconds timeout) {
                   stage->wait_ready();
                   at::Tensor work = is_root ? stage->host() : stage->host().clone();
                   premultiply(work, reduce_op);
                   Collective c = collective(OpType::Reduce, seq, dtype, count, timeout, keep_alive({work}), root,
                                             reduce_op.reduction);
                   tgpg::allreduce(c, bytes_of(work), options_.direct_max_bytes, allreduce_hosts_);
                   c.wait_sends_released();
                   if (!is_root) return;
                   if (reduce_op.reduction.average) work.div_(size_);
                   stage->write_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  const std::string where = this->where("gather");
  check_root(opts.rootRank, where);
  TORCH_CHECK(inputs.size() == 1, where, ": expected one input tensor, got ", inputs.size(), ".");
  const at::Tensor& input = inputs[0];
  check_dense(input, where);
  const bool is_root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, where,
                ": the root needs a list of ", size_, " output tensors.");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_output(o, where);
      check_same_kind(input, o, where, "output tensor");
    }
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), where, ": only the root rank takes output tensors.");
  }
  const DType dtype = to_dtype(input.scalar_type(), where);
  auto in = std::make_shared<HostStage>(input, /*copy_in=*/true);
  const int64_t n = input.numel();
  at::Tensor gathered = is_root ? at::empty({size_ * n}, input.options().device(at::kCPU)) : at::Tensor();
  const auto root = static_cast<uint32_t>(opts.rootRank);
  return enqueue(c10d::OpType::GATHER, "grpc:gather", inputs, outs, timeout_of(opts.timeout),
                 [this, in, gathered, outs, dtype, n, root](uint64_t seq, std::chrono::milliseconds timeout) mutable {
                   in->wait_ready();
                   Collective c = collective(OpType::Gather, seq, dtype, static_cast<uint64_t>(n), timeout,
                                             keep_alive({in->host()}), root);
                   tgpg::gather(c, in->data(), gathered.defined() ? bytes_of(gathered) : nullptr);
                   c.wait_sends_released();
                   for (size_t r = 0; r < outs.size(); ++r) copy_into(outs[r], gathered.narrow(0, r * n, n));
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  const std::string where = this->where("scatter");
  check_root(opts.rootRank, where);
  TORCH_CHECK(outputs.size() == 1, where, ": expected one output tensor, got ", outputs.size(), ".");
  const at::Tensor& output = outputs[0];
  check_output(output, where);
  const bool is_root = opts.rootRank == rank_;
  at::Tensor packed;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, where,
                ": the root needs a list of ", size_, " input tensors.");
    for (const auto& t : inputs[0]) {
      check_dense(t, where);
      check_same_kind(output, t, where, "input tensor");
    }
    packed = pack(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), where, ": only the root rank takes input tensors.");
  }
  const DType dtype = to_dtype(output.scalar_type(), where);
  auto out = std::make_shared<HostStage>(output, /*copy_in=*/false);
  const auto root = static_cast<uint32_t>(opts.rootRank);
  const auto n = static_cast<uint64_t>(output.numel());
  return enqueue(c10d::OpType::SCATTER, "grpc:scatter", is_root ? inputs[0] : std::vector<at::Tensor>{}, outputs,
                 timeout_of(opts.timeout),
                 [this, out, packed, dtype, n, root](uint64_t seq, std::chrono::milliseconds timeout) {
                   Collective c = collective(OpType::Scatter, seq, dtype, n, timeout, keep_alive({packed}), root);
                   tgpg::scatter(c, packed.defined() ? bytes_of(packed) : nullptr, out->data());
                   c.wait_sends_released();
                   out->write_back();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  const std::string where = this->where("reduce_scatter");
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, where,
              ": expected one output tensor and a list of ", size_, " input tensors.");
  check_output(outputs[0], where);
  for (const auto& t : inputs[0]) {
    check_dense(t, where);
    check_same_kind(outputs[0], t, where, "input tensor");
  }
  return reduce_scatter_packed(pack(inputs[0]), outputs[0], inputs[0], opts, where);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  const std::string where = this->where("reduce_scatter_tensor");
  check_output(output, where);
  check_dense(input, where);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), where, ": input dtype ", input.scalar_type(),
              " differs from output dtype ", output.scalar_type(), ".");
  TORCH_CHECK(input.numel() == size_ * output.numel(), where, ": input must have world_size * ", output.numel(),
              " = ", size_ * output.numel(), " elements, got ", input.numel(), ".");
  return reduce_scatter_packed(private_cpu_copy(input), output, {input}, opts, where);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const std::string where = this->where("reduce_scatter_tensor_coalesced");
  TORCH_CHECK(outputs.size() == inputs.size(), where, ": got ", inputs.size(), " inputs but ", outputs.size(),
              " outputs.");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  // Jobs run in order, so the last one completing means all have.
  return works.empty() ? barrier(c10d::BarrierOptions()) : works.back();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::reduce_scatter_packed(at::Tensor packed, at::Tensor output,
                                                                       const std::vector<at::Tensor>& inputs,
                                                                       const c10d::ReduceScatterOptions& opts,
                                                                       const std::string& where) {
  const DType dtype = to_dtype(output.scalar_type(), where);
  const TorchReduction reduce_op = to_reduction(opts.reduceOp, dtype, where);
  const int64_t n = output.numel();
  const size_t bytes = static_cast<size_t>(n) * element_size(dtype);
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, "grpc:reduce_scatter", inputs, {output}, timeout_of(opts.timeout),
      [this, packed, output, dtype, reduce_op, n, bytes](uint64_t seq, std::chrono::milliseconds timeout) mutable {
        premultiply(packed, reduce_op);
        at::Tensor mine = packed.narrow(0, rank_ * n, n);
        if (on_segment(bytes)) {
          // The result lands in this rank's own block, whose input the segment has taken by then.
          const OpDescriptor d =
              descriptor(OpType::ReduceScatter, seq, dtype, static_cast<uint64_t>(n), 0, reduce_op.reduction);
          segment_->reduce_scatter(bytes_of(packed), bytes_of(mine), static_cast<size_t>(n), dtype,
                                   reduce_op.reduction.op, d, segment_wait(d, timeout));
          count_segment_bytes(bytes * size_, bytes * (size_ - 1));
        } else {
          Collective c = collective(OpType::ReduceScatter, seq, dtype, static_cast<uint64_t>(n), timeout,
                                    keep_alive({packed}), /*root=*/0, reduce_op.reduction);
          narrow_between_hosts(c);
          tgpg::reduce_scatter(c, bytes_of(packed));
          c.wait_sends_released();
        }
        if (reduce_op.reduction.average) mine.div_(size_);
        copy_into(output, mine);
      },
      run_here(waited_at_once(opts), output));
}

namespace {

// Splits along dim 0, as torch's all_to_all_single: `splits` gives rows per
// rank (empty: equal), each row `row` elements. Returns each rank's block.
std::vector<Block> split_blocks(const std::vector<int64_t>& splits, int64_t rows, int64_t row, int world,
                                const std::string& where, const char* which) {
  std::vector<int64_t> counts = splits;
  if (counts.empty()) {
    TORCH_CHECK(rows % world == 0, where, ": the ", which, " has ", rows, " rows along dim 0, which do not split "
                "evenly over ", world, " ranks; pass ", which, "_split_sizes.");
    counts.assign(world, rows / world);
  }
  TORCH_CHECK(static_cast<int>(counts.size()) == world, where, ": ", which, "_split_sizes has ", counts.size(),
              " entries; it needs one per rank (", world, ").");
  std::vector<Block> blocks;
  blocks.reserve(world);
  int64_t offset = 0;
  for (int64_t count : counts) {
    TORCH_CHECK(count >= 0, where, ": ", which, "_split_sizes holds a negative size (", count, ").");
    blocks.push_back({static_cast<uint64_t>(offset * row), static_cast<uint64_t>(count * row)});
    offset += count;
  }
  TORCH_CHECK(offset == rows, where, ": ", which, "_split_sizes add up to ", offset, " rows, but the ", which,
              " has ", rows, " along dim 0.");
  return blocks;
}

// Back-to-back blocks of the given tensors' sizes.
std::vector<Block> blocks_of(const std::vector<at::Tensor>& tensors) {
  std::vector<Block> blocks;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    blocks.push_back({offset, static_cast<uint64_t>(t.numel())});
    offset += static_cast<uint64_t>(t.numel());
  }
  return blocks;
}

// Copies each block of the exchange's result into its output tensor.
std::function<void(const at::Tensor&)> unpack_blocks(std::vector<at::Tensor> outputs, std::vector<Block> recv) {
  return [outputs = std::move(outputs), recv = std::move(recv)](const at::Tensor& result) mutable {
    for (size_t r = 0; r < outputs.size(); ++r) {
      copy_into(outputs[r], result.narrow(0, static_cast<int64_t>(recv[r].offset), static_cast<int64_t>(recv[r].count))
                                .view_as(outputs[r]));
    }
  };
}

int64_t row_elements(const at::Tensor& t) {
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return row;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_split_sizes,
                                                               std::vector<int64_t>& input_split_sizes,
                                                               const c10d::AllToAllOptions& opts) {
  const std::string where = this->where("alltoall_base");
  check_dense(input, where);
  check_output(output, where);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), where, ": input dtype ", input.scalar_type(),
              " differs from output dtype ", output.scalar_type(), ".");
  const auto rows = [](const at::Tensor& t) { return t.dim() == 0 ? int64_t{1} : t.size(0); };
  TORCH_CHECK(row_elements(input) == row_elements(output), where, ": input rows of ", row_elements(input),
              " elements differ from output rows of ", row_elements(output), ".");
  std::vector<Block> send =
      split_blocks(input_split_sizes, rows(input), row_elements(input), size_, where, "input");
  std::vector<Block> recv =
      split_blocks(output_split_sizes, rows(output), row_elements(output), size_, where, "output");
  at::Tensor out = at::empty({output.numel()}, output.options().device(at::kCPU));
  return alltoall_packed(private_cpu_copy(input), std::move(send), out, std::move(recv), {input}, {output},
                         timeout_of(opts.timeout), where,
                         [output](const at::Tensor& result) mutable { copy_into(output, result.view_as(output)); },
                         Exchange{});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  const std::string where = this->where("alltoall");
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_, where,
              ": expected ", size_, " input and ", size_, " output tensors.");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_dense(inputs[i], where);
    check_output(outputs[i], where);
    TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                    outputs[i].scalar_type() == inputs[0].scalar_type(),
                where, ": every input and output tensor must have one dtype; got ", inputs[0].scalar_type(), " and ",
                (inputs[i].scalar_type() != inputs[0].scalar_type() ? inputs[i] : outputs[i]).scalar_type(), ".");
  }
  std::vector<Block> send = blocks_of(inputs);
  std::vector<Block> recv = blocks_of(outputs);
  const uint64_t total_out = recv.back().offset + recv.back().count;
  at::Tensor out = at::empty({static_cast<int64_t>(total_out)}, inputs[0].options().device(at::kCPU));
  return alltoall_packed(pack(inputs), send, out, recv, inputs, outputs, timeout_of(opts.timeout), where,
                         unpack_blocks(outputs, recv), Exchange{});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allgather_uneven(std::vector<at::Tensor>& inputs,
                                                                  std::vector<at::Tensor> outputs,
                                                                  const c10d::AllgatherOptions& opts,
                                                                  const std::string& where) {
  const at::Tensor& input = inputs[0];
  TORCH_CHECK(outputs[rank_].numel() == input.numel(), where, ": output tensor ", rank_,
              " (this rank's own) has ", outputs[rank_].numel(), " elements but the input has ", input.numel(),
              "; output tensor r must have rank r's input size.");
  // Every peer gets the whole input.
  std::vector<Block> send(size_, Block{0, static_cast<uint64_t>(input.numel())});
  std::vector<Block> recv = blocks_of(outputs);
  const uint64_t total_out = recv.back().offset + recv.back().count;
  at::Tensor out = at::empty({static_cast<int64_t>(total_out)}, input.options().device(at::kCPU));
  return alltoall_packed(private_cpu_copy(input), send, out, recv, inputs, outputs, timeout_of(opts.timeout), where,
                         unpack_blocks(outputs, recv),
                         Exchange{OpType::Allgather, c10d::OpType::ALLGATHER, "grpc:all_gather"});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::alltoall_packed(at::Tensor in, std::vector<Block> send,
                                                                 at::Tensor out, std::vector<Block> recv,
                                                                 const std::vector<at::Tensor>& inputs,
                                                                 std::vector<at::Tensor> outputs,
                                                                 std::chrono::milliseconds timeout,
                                                                 const std::string& where,
                                                                 std::function<void(const at::Tensor&)> unpack,
                                                                 Exchange exchange) {
  const DType dtype = to_dtype(in.scalar_type(), where);
  const auto total = static_cast<uint64_t>(in.numel());
  return enqueue(exchange.type, exchange.title, inputs, std::move(outputs), timeout,
                 [this, in, out, send = std::move(send), recv = std::move(recv), dtype, total,
                  unpack = std::move(unpack), op = exchange.op](uint64_t seq, std::chrono::milliseconds timeout) {
                   Collective c = collective(op, seq, dtype, total, timeout, keep_alive({in}));
                   tgpg::alltoallv(c, bytes_of(in), send, bytes_of(out), recv);
                   c.wait_sends_released();
                   unpack(out);
                 });
}

}  // namespace tgpg
