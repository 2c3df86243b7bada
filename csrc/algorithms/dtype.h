#pragma once

#include <cstddef>
#include <cstdint>

namespace tgpg {

// Element types the backend moves, and reduces unless is_reducible() says not.
// Numbered explicitly because the value travels in every frame header; never
// renumber.
enum class DType : uint32_t {
  Float32 = 1,
  Float64 = 2,
  Float16 = 3,
  BFloat16 = 4,
  Int8 = 5,
  Int16 = 6,
  Int32 = 7,
  Int64 = 8,
  UInt8 = 9,
  Bool = 10,
  UInt16 = 11,
  UInt32 = 12,
  UInt64 = 13,
  // Moved only: what a sum of two float8 values should round to is the
  // caller's scaling recipe's business, and torch itself reduces complex
  // tensors as real pairs (torch.view_as_real).
  Float8E4M3FN = 14,
  Float8E5M2 = 15,
  Float8E4M3FNUZ = 16,
  Float8E5M2FNUZ = 17,
  Float8E8M0FNU = 18,
  Complex32 = 19,
  Complex64 = 20,
  Complex128 = 21,
  Float4E2M1FNX2 = 22,  // two float4 values per byte (torch 2.8 and later)
};

size_t element_size(DType dtype);
// torch's name of the dtype, without "torch.".
const char* dtype_name(DType dtype);
// float32, float64, float16 and bfloat16: the dtypes that AVG applies to and bitwise ops do not.
bool is_floating(DType dtype);
// Whether reduce_into() takes the dtype; the others can only be moved.
bool is_reducible(DType dtype);

}  // namespace tgpg
