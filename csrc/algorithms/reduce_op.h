#pragma once

#include <cstdint>
#include <optional>
#include <string>

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

// What ranks must agree on for a reduction: how elements combine, and whether
// the result is then divided by the world size (AVG). It travels in every frame
// header, because ranks that reduce with SUM and MAX would each return a
// different, plausible-looking result without any error.
struct Reduction {
  ReduceOp op = ReduceOp::Sum;
  bool average = false;
};

// The header's `reduction` field: 0 for collectives that do not reduce.
uint32_t reduction_code(const std::optional<Reduction>& reduction);
// "SUM", "AVG", ..., or "none" for 0.
std::string reduction_name(uint32_t code);

}  // namespace tgpg
