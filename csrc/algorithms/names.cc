#include "algorithms/dtype.h"
#include "algorithms/op_type.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::Complex128:
      return 16;
    case DType::Float64:
    case DType::Int64:
    case DType::UInt64:
    case DType::Complex64:
      return 8;
    case DType::Float32:
    case DType::Int32:
    case DType::UInt32:
    case DType::Complex32:
      return 4;
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int16:
    case DType::UInt16:
      return 2;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool:
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:
    case DType::Float8E4M3FNUZ:
    case DType::Float8E5M2FNUZ:
    case DType::Float8E8M0FNU:
    case DType::Float4E2M1FNX2:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    case DType::UInt16: return "uint16";
    case DType::UInt32: return "uint32";
    case DType::UInt64: return "uint64";
    case DType::Float8E4M3FN: return "float8_e4m3fn";
    case DType::Float8E5M2: return "float8_e5m2";
    case DType::Float8E4M3FNUZ: return "float8_e4m3fnuz";
    case DType::Float8E5M2FNUZ: return "float8_e5m2fnuz";
    case DType::Float8E8M0FNU: return "float8_e8m0fnu";
    case DType::Complex32: return "complex32";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
    case DType::Float4E2M1FNX2: return "float4_e2m1fn_x2";
  }
  return "unknown dtype";
}

bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Float16 ||
         dtype == DType::BFloat16;
}

bool is_reducible(DType dtype) {
  switch (dtype) {
    case DType::Float32:
    case DType::Float64:
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int8:
    case DType::Int16:
    case DType::Int32:
    case DType::Int64:
    case DType::UInt8:
    case DType::UInt16:
    case DType::UInt32:
    case DType::UInt64:
    case DType::Bool:
      return true;
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:
    case DType::Float8E4M3FNUZ:
    case DType::Float8E5M2FNUZ:
    case DType::Float8E8M0FNU:
    case DType::Complex32:
    case DType::Complex64:
    case DType::Complex128:
    case DType::Float4E2M1FNX2:
      return false;
  }
  return false;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Product: return "PRODUCT";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::BitAnd: return "BAND";
    case ReduceOp::BitOr: return "BOR";
    case ReduceOp::BitXor: return "BXOR";
  }
  return "unknown op";
}

namespace {
constexpr uint32_t kAverageCode = 64;  // apart from every 1 + ReduceOp
}  // namespace

uint32_t reduction_code(const std::optional<Reduction>& reduction) {
  if (!reduction) return 0;
  if (reduction->average) return kAverageCode;
  return 1 + static_cast<uint32_t>(reduction->op);
}

std::string reduction_name(uint32_t code) {
  if (code == 0) return "none";
  if (code == kAverageCode) return "AVG";
  if (code <= static_cast<uint32_t>(ReduceOp::BitXor) + 1) return reduce_op_name(static_cast<ReduceOp>(code - 1));
  return "unknown reduction " + std::to_string(code);
}

const char* op_name(OpType op) { return op_name(static_cast<uint32_t>(op)); }

bool has_root(OpType op) {
  return op == OpType::Broadcast || op == OpType::Reduce || op == OpType::Gather || op == OpType::Scatter;
}

const char* op_name(uint32_t op) {
  switch (static_cast<OpType>(op)) {
    case OpType::Allreduce: return "allreduce";
    case OpType::Broadcast: return "broadcast";
    case OpType::Allgather: return "allgather";
    case OpType::Barrier: return "barrier";
    case OpType::AllreduceCoalesced: return "allreduce_coalesced";
    case OpType::Reduce: return "reduce";
    case OpType::Gather: return "gather";
    case OpType::Scatter: return "scatter";
    case OpType::ReduceScatter: return "reduce_scatter";
    case OpType::Alltoall: return "alltoall";
    case OpType::PointToPoint: return "send";
  }
  return "unknown collective";
}

}  // namespace tgpg
