#include "backend/type_mapping.h"

#include <c10/util/Exception.h>

#include "algorithms/reduce_kernels.h"

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
    default:
      TORCH_CHECK(false, where, ": dtype ", c10::toString(type),
                  " is not supported by the grpc backend. Supported: float32, float64, float16, "
                  "bfloat16, int8, int16, int32, int64, uint8, bool.",
                  c10::isComplexType(type) ? " For complex tensors, pass torch.view_as_real(t) with SUM." : "");
  }
}

Reduction to_reduction(const c10d::ReduceOp& op, DType dtype, const std::string& where) {
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
    default:
      TORCH_CHECK(false, where, ": this reduce op is not supported by the grpc backend. Supported: "
                  "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR.");
  }
  TORCH_CHECK(reduction_supported(dtype, r.op), where, ": ReduceOp.", reduce_op_name(r.op),
              " is a bitwise op and needs an integer or bool tensor, got ", dtype_name(dtype), ".");
  return r;
}

}  // namespace tgpg
