#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/dtype.h"

namespace tgpg_test {

// Reading and writing single elements of every dtype the tests use, written
// independently of the kernels under test so that they can serve as a reference.

// Half the gap between 1 and the next larger value of a floating dtype.
double unit_roundoff(tgpg::DType dtype);

// A floating element as a double (exact).
double load_floating(tgpg::DType dtype, const std::byte* p);
// Stores `value` rounded to the nearest even value of a floating dtype.
void store_floating(tgpg::DType dtype, double value, std::byte* p);

// An integer element, sign- or zero-extended as its dtype says; a uint64
// above INT64_MAX comes back as its bit pattern.
int64_t load_integer(tgpg::DType dtype, const std::byte* p);
// Stores the low bits of `value` that fit the integer dtype (wrap-around).
void store_integer(tgpg::DType dtype, int64_t value, std::byte* p);

}  // namespace tgpg_test
