#include "elements.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace tgpg_test {
namespace {

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void store(T v, std::byte* p) {
  std::memcpy(p, &v, sizeof(T));
}

// bfloat16 is the upper half of a float32: round the lower half away, to
// nearest even. The tests never make NaNs.
uint16_t float_to_bf16(float f) {
  const uint32_t bits = load<uint32_t>(reinterpret_cast<const std::byte*>(&f));
  const uint32_t lower = bits & 0xffffu;
  uint32_t upper = bits >> 16;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++upper;
  return static_cast<uint16_t>(upper);
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  return load<float>(reinterpret_cast<const std::byte*>(&bits));
}

// IEEE binary16, decoded field by field rather than through the compiler's _Float16.
double f16_to_double(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

uint16_t double_to_f16(double value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(value);
  // The gap between neighbouring values where `magnitude` lies; dividing by a
  // power of two is exact, so nearbyint rounds to nearest even once.
  int exponent;
  std::frexp(magnitude, &exponent);
  const double quantum = std::ldexp(1.0, std::max(exponent - 1, -14) - 10);
  const double rounded = std::nearbyint(magnitude / quantum) * quantum;
  if (rounded >= 65536.0) return sign | 0x7c00;
  if (rounded < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(rounded / std::ldexp(1.0, -24));
  std::frexp(rounded, &exponent);
  const auto mantissa = static_cast<uint16_t>(rounded / std::ldexp(1.0, exponent - 11) - 1024);
  return sign | static_cast<uint16_t>((exponent - 1 + 15) << 10) | mantissa;
}

}  // namespace

double unit_roundoff(tgpg::DType dtype) {
  switch (dtype) {
    case tgpg::DType::Float64: return std::ldexp(1.0, -53);
    case tgpg::DType::Float32: return std::ldexp(1.0, -24);
    case tgpg::DType::Float16: return std::ldexp(1.0, -11);
    case tgpg::DType::BFloat16: return std::ldexp(1.0, -8);
    default: throw std::logic_error("unit_roundoff of an integer dtype");
  }
}

double load_floating(tgpg::DType dtype, const std::byte* p) {
  switch (dtype) {
    case tgpg::DType::Float64: return load<double>(p);
    case tgpg::DType::Float32: return load<float>(p);
    case tgpg::DType::Float16: return f16_to_double(load<uint16_t>(p));
    case tgpg::DType::BFloat16: return bf16_to_float(load<uint16_t>(p));
    default: throw std::logic_error("load_floating of an integer dtype");
  }
}

void store_floating(tgpg::DType dtype, double value, std::byte* p) {
  switch (dtype) {
    case tgpg::DType::Float64: return store<double>(value, p);
    case tgpg::DType::Float32: return store<float>(static_cast<float>(value), p);
    case tgpg::DType::Float16: return store<uint16_t>(double_to_f16(value), p);
    // Through float32 first: double rounding cannot matter for the values the
    // tests make, which are float32 values to begin with.
    case tgpg::DType::BFloat16: return store<uint16_t>(float_to_bf16(static_cast<float>(value)), p);
    default: throw std::logic_error("store_floating of an integer dtype");
  }
}

int64_t load_integer(tgpg::DType dtype, const std::byte* p) {
  switch (dtype) {
    case tgpg::DType::Int8: return load<int8_t>(p);
    case tgpg::DType::Int16: return load<int16_t>(p);
    case tgpg::DType::Int32: return load<int32_t>(p);
    case tgpg::DType::Int64: return load<int64_t>(p);
    case tgpg::DType::UInt8: return load<uint8_t>(p);
    case tgpg::DType::UInt16: return load<uint16_t>(p);
    case tgpg::DType::UInt32: return load<uint32_t>(p);
    case tgpg::DType::UInt64: return static_cast<int64_t>(load<uint64_t>(p));
    default: throw std::logic_error("load_integer of a non-integer dtype");
  }
}

void store_integer(tgpg::DType dtype, int64_t value, std::byte* p) {
  const auto bits = static_cast<uint64_t>(value);
  switch (dtype) {
    case tgpg::DType::Int8:
    case tgpg::DType::UInt8: return store<uint8_t>(static_cast<uint8_t>(bits), p);
    case tgpg::DType::Int16:
    case tgpg::DType::UInt16: return store<uint16_t>(static_cast<uint16_t>(bits), p);
    case tgpg::DType::Int32:
    case tgpg::DType::UInt32: return store<uint32_t>(static_cast<uint32_t>(bits), p);
    case tgpg::DType::Int64:
    case tgpg::DType::UInt64: return store<uint64_t>(bits, p);
    default: throw std::logic_error("store_integer of a non-integer dtype");
  }
}

}  // namespace tgpg_test
