#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>

#include "algorithms/dtype.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

// Translations between torch's vocabulary and the algorithms' plain one.
// Each throws a c10::Error that names the op and the rank when torch asks for
// something this backend cannot do.
DType to_dtype(at::ScalarType type, const std::string& where);

// A torch reduce op as this backend runs it: `reduction` for the algorithms,
// and for PREMUL_SUM (which runs as SUM) the factor each rank multiplies its
// own input by first (FSDP2 divides gradients so under
// set_gradient_divide_factor). One call gives both, so no op can run a
// PREMUL_SUM as a plain SUM. Raises when a PREMUL_SUM carries no factor; a
// tensor factor is read here, once per call.
struct TorchReduction {
  Reduction reduction;
  std::optional<double> premultiplier;
};
TorchReduction to_reduction(const c10d::ReduceOp& op, DType dtype, const std::string& where);

// Multiplies `t` in place by the reduction's premultiplier, if it has one.
void premultiply(const at::Tensor& t, const TorchReduction& reduce);

}  // namespace tgpg
