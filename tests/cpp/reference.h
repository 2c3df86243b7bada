#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algorithms/dtype.h"
#include "algorithms/reduce_op.h"

namespace tgpg_test {

// Deterministic inputs for `op` over `count` elements, different for every
// seed. Floating values stay where a reduction over up to eight ranks neither
// overflows nor underflows; integers use their whole range, so that sums and
// products wrap around.
std::vector<std::byte> make_input(tgpg::DType dtype, tgpg::ReduceOp op, uint64_t seed, size_t count);

// Arbitrary bytes: for collectives that only move data, and for output
// buffers, whose old contents must not show through.
std::vector<std::byte> make_bytes(uint64_t seed, size_t size);

// Whether got[i] is op(inputs[0][i], inputs[1][i], ...) for i < count. Integers
// must match exactly (with wrap-around); floating results must match a
// float64 reference within the rounding that the dtype allows, and min/max
// exactly.
::testing::AssertionResult matches_reduction(tgpg::DType dtype, tgpg::ReduceOp op,
                                             const std::vector<const std::byte*>& inputs,
                                             const std::byte* got, size_t count);

}  // namespace tgpg_test
