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

// PREMUL_SUM is SUM here; its factor comes from premultiplier(), called after.
Reduction to_reduction(const c10d::ReduceOp& op, DType dtype, const std::string& where);

// The factor that PREMUL_SUM has each rank multiply its own input by before
// the SUM (FSDP2 divides gradients so under set_gradient_divide_factor); none
// for every other op. Raises when a PREMUL_SUM carries no factor. A tensor
// factor is read here, once per call.
std::optional<double> premultiplier(const c10d::ReduceOp& op, const std::string& where);

// Multiplies `t` by the factor, if any, in place.
void premultiply(const at::Tensor& t, const std::optional<double>& factor);

}  // namespace tgpg
