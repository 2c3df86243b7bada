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

Reduction to_reduction(const c10d::ReduceOp& op, DType dtype, const std::string& where);

}  // namespace tgpg
