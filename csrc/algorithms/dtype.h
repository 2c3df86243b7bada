#pragma once

#include <cstddef>
#include <cstdint>

namespace tgpg {

// Element types the backend moves and reduces. Numbered explicitly because the
// value travels in every frame header; never renumber.
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
};

size_t element_size(DType dtype);
const char* dtype_name(DType dtype);
bool is_floating(DType dtype);

}  // namespace tgpg
