// all_reduce of sparse COO tensors (SUM), as gloo runs it, so that DDP trains
// models with sparse gradients (nn.Embedding(sparse=True)). Ranks hold
// different numbers of nonzeros, so it takes two collectives issued together:
// an all_gather of each rank's description (dtype, dims, nnz, sizes), then an
// all_gather of uneven blocks holding each rank's indices and values. Every
// rank then adds the ranks' tensors in rank order and coalesces, the same
// operations gloo runs, so both backends give the same bits.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "algorithms/collectives.h"
#include "backend/process_group_grpc.h"
#include "backend/tensor_checks.h"

namespace tgpg {
namespace {

// A rank's description, one int64 row of the gathered table.
enum Field : int64_t { kDtype = 0, kSparseDim, kDenseDim, kNnz, kSizes };

// The dtypes gloo reduces that torch's sparse add (which sums the ranks'
// tensors here, as in gloo) has a kernel for: not bool, not float16.
void check_sparse_dtype(at::ScalarType type, const std::string& where) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      return;
    default:
      TORCH_CHECK(false, where, ": sparse tensors of dtype ", type,
                  " cannot be summed (torch's sparse add has no kernel for it); use float32, float64, bfloat16 or "
                  "an integer dtype.");
  }
}

std::vector<int64_t> row_sizes(const at::Tensor& row) {
  const int64_t* p = row.data_ptr<int64_t>();
  return std::vector<int64_t>(p + kSizes, p + row.numel());
}

std::string describe(const at::Tensor& row) {
  const int64_t* p = row.data_ptr<int64_t>();
  std::ostringstream out;
  out << static_cast<at::ScalarType>(p[kDtype]) << " of size " << at::IntArrayRef(row_sizes(row))
      << " with sparse_dim " << p[kSparseDim];
  return out.str();
}

uint64_t block_bytes(const at::Tensor& row, int64_t dense_numel) {
  const int64_t* p = row.data_ptr<int64_t>();
  const auto item = static_cast<int64_t>(c10::elementSize(static_cast<at::ScalarType>(p[kDtype])));
  return static_cast<uint64_t>(p[kNnz] * (p[kSparseDim] * static_cast<int64_t>(sizeof(int64_t)) + dense_numel * item));
}

// What the two jobs of one call share: this rank's coalesced host copy, and
// the table of every rank's description that the first job fills.
struct SparseCall {
  at::Tensor input;  // coalesced, on the CPU
  at::Tensor table;  // world rows of kSizes + dim int64
  std::string where;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceOptions& opts) {
  const std::string where = this->where("allreduce of a sparse tensor");
  TORCH_CHECK(tensors.size() == 1, where, ": expected one tensor, got ", tensors.size(), ".");
  at::Tensor tensor = tensors[0];
  TORCH_CHECK(tensor.layout() == at::kSparse, where, ": expected a sparse COO tensor, got layout ", tensor.layout(),
              ".");
  // Sums of index sets are what gloo defines too; MAX or PRODUCT of sparse
  // tensors would need a rule for the missing (zero) entries.
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, where,
              ": sparse tensors are reduced with ReduceOp.SUM only (as with gloo).");
  check_sparse_dtype(tensor.scalar_type(), where);

  auto call = std::make_shared<SparseCall>();
  call->where = where;
  {
    at::AutoDispatchBelowAutograd below_autograd;
    // Coalesced on the calling thread, as gloo does for CUDA tensors: the
    // copy to the host is ordered after the caller's work on its stream.
    call->input = tensor.coalesce().to(at::kCPU);
  }
  const int64_t dim = call->input.dim();
  const int64_t row = kSizes + dim;
  call->table = at::zeros({size_, row}, at::kLong);
  int64_t* mine = call->table[rank_].data_ptr<int64_t>();
  mine[kDtype] = static_cast<int64_t>(call->input.scalar_type());
  mine[kSparseDim] = call->input.sparse_dim();
  mine[kDenseDim] = call->input.dense_dim();
  mine[kNnz] = call->input._nnz();
  for (int64_t d = 0; d < dim; ++d) mine[kSizes + d] = call->input.size(d);

  // First: every rank's description. A rank whose tensor has another number
  // of dimensions sends rows of another length, which the transport refuses
  // as a mismatch on both sides.
  enqueue(c10d::OpType::_ALLREDUCE_SPARSE, "grpc:all_reduce_sparse", tensors, {}, timeout_of(opts.timeout),
          [this, call, row](uint64_t seq, std::chrono::milliseconds timeout) {
            Collective c = collective(OpType::Allgather, seq, DType::Int64, static_cast<uint64_t>(row), timeout,
                                      keep_alive({call->table}));
            tgpg::allgather(c, static_cast<std::byte*>(call->table.data_ptr()));
            c.wait_sends_released();
            // Every rank holds the same table, so every rank raises the same error.
            const at::Tensor own = call->table[rank_];
            for (int r = 0; r < size_; ++r) {
              const at::Tensor other = call->table[r];
              TORCH_CHECK(other.narrow(0, 0, kNnz).equal(own.narrow(0, 0, kNnz)) &&
                              other.narrow(0, kSizes, row - kSizes).equal(own.narrow(0, kSizes, row - kSizes)),
                          call->where, ": rank ", r, "'s tensor is ", describe(other), " but rank ", rank_, "'s is ",
                          describe(own), "; every rank must pass a sparse tensor of one dtype and size.");
            }
          });

  // Then: every rank's indices and values, one block of bytes per rank.
  return enqueue(
      c10d::OpType::_ALLREDUCE_SPARSE, "grpc:all_reduce_sparse", tensors, tensors, timeout_of(opts.timeout),
      [this, call, tensor](uint64_t seq, std::chrono::milliseconds timeout) mutable {
        at::AutoDispatchBelowAutograd below_autograd;
        const at::Tensor& input = call->input;
        const int64_t sparse_dim = input.sparse_dim();
        const std::vector<int64_t> value_shape(input.sizes().begin() + sparse_dim, input.sizes().end());
        int64_t dense_numel = 1;
        for (int64_t s : value_shape) dense_numel *= s;

        std::vector<Block> recv;
        uint64_t total = 0;
        for (int r = 0; r < size_; ++r) {
          const uint64_t bytes = block_bytes(call->table[r], dense_numel);
          recv.push_back({total, bytes});
          total += bytes;
        }
        const at::Tensor indices = input._indices().contiguous();
        const at::Tensor values = input._values().contiguous();
        const at::Tensor packed =
            at::cat({indices.reshape({-1}).view(at::kByte), values.reshape({-1}).view(at::kByte)});
        at::Tensor gathered = at::empty({static_cast<int64_t>(total)}, at::kByte);
        const std::vector<Block> send(size_, Block{0, static_cast<uint64_t>(packed.numel())});
        Collective c = collective(OpType::Allgather, seq, DType::UInt8, static_cast<uint64_t>(packed.numel()),
                                  timeout, keep_alive({packed}));
        tgpg::alltoallv(c, static_cast<const std::byte*>(packed.data_ptr()), send,
                        static_cast<std::byte*>(gathered.data_ptr()), recv);
        c.wait_sends_released();

        // The sum gloo computes: rank 0's tensor plus each next rank's, coalesced.
        at::Tensor output;
        for (int r = 0; r < size_; ++r) {
          const int64_t nnz = call->table[r].data_ptr<int64_t>()[kNnz];
          const int64_t index_bytes = nnz * sparse_dim * static_cast<int64_t>(sizeof(int64_t));
          // A copy of its own: a block may start at any byte, and indices and
          // values are read in place as int64 and as the dtype.
          at::Tensor block =
              gathered.narrow(0, static_cast<int64_t>(recv[r].offset), static_cast<int64_t>(recv[r].count)).clone();
          at::Tensor rank_indices = block.narrow(0, 0, index_bytes).view(at::kLong).reshape({sparse_dim, nnz});
          std::vector<int64_t> shape{nnz};
          shape.insert(shape.end(), value_shape.begin(), value_shape.end());
          at::Tensor rank_values =
              block.narrow(0, index_bytes, block.numel() - index_bytes).view(input.scalar_type()).reshape(shape);
          at::Tensor term = at::sparse_coo_tensor(rank_indices, rank_values, input.sizes(), input.options());
          output = r == 0 ? term : output.add_(term);
        }
        output = output.coalesce();
        c10::OptionalDeviceGuard guard;
        if (!tensor.device().is_cpu()) guard.reset_device(tensor.device());
        tensor.copy_(output);
      });
}

}  // namespace tgpg
