#include "backend/type_mapping.h"

#include <c10/util/Exception.h>

#include "algorithms/reduce_kernels.h"

// torch 2.8 added float4_e2m1fn_x2; the oldest supported torch (2.7) lacks it.
#if __has_include(<c10/util/Float4_e2m1fn_x2.h>)
#define TGPG_TORCH_HAS_FLOAT4 1
#else
#define TGPG_TORCH_HAS_FLOAT4 0
#endif

namespace tgpg {

DType to_dtype(at::ScalarType type, const std::string& where) {
  switch (type) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kByte: return DType::UInt8;
    case at::kBool: return DType::Bool;
    case at::kUInt16: return DType::UInt16;
    case at::kUInt32: return DType::UInt32;
    case at::kUInt64: return DType::UInt64;
    case at::kFloat8_e4m3fn: return DType::Float8E4M3FN;
    case at::kFloat8_e5m2: return DType::Float8E5M2;
    case at::kFloat8_e4m3fnuz: return DType::Float8E4M3FNUZ;
    case at::kFloat8_e5m2fnuz: return DType::Float8E5M2FNUZ;
    case at::kFloat8_e8m0fnu: return DType::Float8E8M0FNU;
    case at::kComplexHalf: return DType::Complex32;
    case at::kComplexFloat: return DType::Complex64;
    case at::kComplexDouble: return DType::Complex128;
#if TGPG_TORCH_HAS_FLOAT4
    case at::kFloat4_e2m1fn_x2: return DType::Float4E2M1FNX2;
#endif
    default:
      TORCH_CHECK(false, where, ": dtype ", c10::toString(type),
                  " is not supported by the grpc backend. Supported: float32, float64, float16, bfloat16, int8, "
                  "int16, int32, int64, uint8, uint16, uint32, uint64 and bool; also, to be moved but not "
                  "reduced, the float8 types, float4_e2m1fn_x2, and complex32, complex64 and complex128.");
  }
}

namespace {

std::optional<double> premultiplier(const c10d::ReduceOp& op, const std::string& where) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return std::nullopt;
  const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(supplement != nullptr, where, ": ReduceOp.PREMUL_SUM came without its factor; make it with "
              "dist.ReduceOp.PREMUL_SUM(factor).");
  // A tensor factor may live on a device; reading it here waits for it there.
  if (supplement->tensor_factor.defined()) return supplement->tensor_factor.item<double>();
  return supplement->double_factor;
}

}  // namespace

TorchReduction to_reduction(const c10d::ReduceOp& op, DType dtype, const std::string& where) {
  const bool complex = dtype == DType::Complex32 || dtype == DType::Complex64 || dtype == DType::Complex128;
  TORCH_CHECK(is_reducible(dtype), where, ": the grpc backend moves ", dtype_name(dtype),
              " tensors (broadcast, gathers, scatter, all-to-all, send and receive) but does not reduce them. ",
              complex ? "Reduce torch.view_as_real(t) with SUM or AVG instead."
                      : "Cast to bfloat16 or float32 before reducing, and back after.");
  Reduction r{ReduceOp::Sum, false};
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = ReduceOp::Sum; break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(is_floating(dtype), where, ": ReduceOp.AVG needs a floating-point tensor, got ",
                  dtype_name(dtype), ". Use ReduceOp.SUM and divide by the world size yourself.");
      r = {ReduceOp::Sum, true};
      break;
    case c10d::ReduceOp::PRODUCT: r.op = ReduceOp::Product; break;
    case c10d::ReduceOp::MIN: r.op = ReduceOp::Min; break;
    case c10d::ReduceOp::MAX: r.op = ReduceOp::Max; break;
    case c10d::ReduceOp::BAND: r.op = ReduceOp::BitAnd; break;
    case c10d::ReduceOp::BOR: r.op = ReduceOp::BitOr; break;
    case c10d::ReduceOp::BXOR: r.op = ReduceOp::BitXor; break;
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK(is_floating(dtype), where, ": ReduceOp.PREMUL_SUM needs a floating-point tensor, got ",
                  dtype_name(dtype), ". Multiply the input yourself and use ReduceOp.SUM.");
      r.op = ReduceOp::Sum;
      break;
    default:
      TORCH_CHECK(false, where, ": this reduce op is not supported by the grpc backend. Supported: "
                  "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM.");
  }
  TORCH_CHECK(reduction_supported(dtype, r.op), where, ": ReduceOp.", reduce_op_name(r.op),
              " is a bitwise op and needs an integer or bool tensor, got ", dtype_name(dtype), ".");
  return {r, premultiplier(op, where)};
}

void premultiply(const at::Tensor& t, const TorchReduction& reduce) {
  if (reduce.premultiplier) t.mul_(*reduce.premultiplier);
}

}  // namespace tgpg
