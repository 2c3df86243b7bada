#pragma once

#include <cstddef>

#include "algorithms/dtype.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

// Vectorised float16/bfloat16 reductions for CPUs with AVX2 and F16C: eight
// elements at a time, widened to float32 and rounded back once. Compilers do
// not vectorise the scalar conversions, which made half-precision reductions
// several times slower than float32 ones. Returns how many leading elements it
// reduced: a multiple of eight, or none where the CPU lacks the instructions.
// The caller reduces the rest with the scalar kernels.
size_t reduce_half_vectorized(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);

}  // namespace tgpg
