#pragma once

#include <cstddef>

#include "algorithms/dtype.h"
#include "algorithms/reduce_op.h"

namespace tgpg {

// Float32 values carried as bfloat16 or float16 on links between hosts
// (TORCH_GRPC_PG_WIRE_DTYPE, docs/options.md). The sender narrows with
// round-to-nearest-even; the receiver widens, which is exact, and reduces in
// float32. AVX2/F16C where the CPU has them, scalar otherwise; both give the
// same bits, so ranks on different CPUs agree.

// Whether `wire` is a dtype float32 may travel as.
bool is_wire_dtype(DType wire);
// dst[i] = wire(src[i]). `src` holds float32 at any address, `dst` gets 2 bytes per element.
void narrow_to_wire(std::byte* dst, const std::byte* src, size_t count, DType wire);
// buf[i] = float(wire(buf[i])): what a receiver of buf would read. Idempotent.
void round_through_wire(std::byte* buf, size_t count, DType wire);
// dst[i] = float(src[i]); `src` holds `wire` values at any address.
void widen_from_wire(std::byte* dst, const std::byte* src, size_t count, DType wire);
// dst[i] = op(dst[i], float(src[i])), in float32.
void reduce_from_wire(std::byte* dst, const std::byte* src, size_t count, DType wire, ReduceOp op);

}  // namespace tgpg
