#pragma once

namespace tgpg {

// AVG is not here: it is SUM followed by a division that the backend glue does
// once on the final result, so every rank divides the same value.
enum class ReduceOp {
  Sum,
  Product,
  Min,
  Max,
  BitAnd,
  BitOr,
  BitXor,
};

const char* reduce_op_name(ReduceOp op);

}  // namespace tgpg
