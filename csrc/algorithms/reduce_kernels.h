#pragma once

#include <cstddef>

#include "algorithms/dtype.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

// Whether `op` is defined for `dtype` (a reducible dtype; bitwise ops need
// integers or bool).
bool reduction_supported(DType dtype, ReduceOp op);

// dst[i] = op(dst[i], src[i]) for `count` elements. `dst` is element-aligned;
// `src` may sit at any address, because received network buffers do.
// float16 and bfloat16 are combined in float32 and rounded once per element.
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);

}  // namespace tgpg
