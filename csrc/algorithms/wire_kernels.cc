#include "algorithms/wire_kernels.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "algorithms/half_scalar.h"
#include "algorithms/half_simd.h"

namespace tgpg {
namespace {

inline float load_float(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store_float(std::byte* p, float v) { std::memcpy(p, &v, 4); }
inline uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void store_u16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }

// One scalar element each way; the vector kernels below give the same bits.
inline uint16_t narrow_one(float f, DType wire) {
  if (wire == DType::BFloat16) return float_to_bf16(f);
  const auto h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
inline float widen_one(uint16_t bits, DType wire) {
  if (wire == DType::BFloat16) return bf16_to_float(bits);
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

inline float apply(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::Sum: return a + b;
    case ReduceOp::Product: return a * b;
    // NaN wins, as in torch.minimum / torch.maximum and reduce_kernels.cc.
    case ReduceOp::Min: return (b < a || b != b) ? b : a;
    case ReduceOp::Max: return (b > a || b != b) ? b : a;
    default: throw std::logic_error("bitwise reduction of float32 values on the wire");
  }
}

#ifdef TGPG_HAVE_X86_HALF_KERNELS

bool have_avx2() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return supported;
}

// Each returns how many leading elements it handled (a multiple of 8); the
// scalar loop finishes the rest.
template <typename Half>
TGPG_AVX2 size_t narrow_blocks(std::byte* dst, const std::byte* src, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) Half::store(dst + 2 * i, _mm256_loadu_ps(reinterpret_cast<const float*>(src + 4 * i)));
  return i;
}

template <typename Half>
TGPG_AVX2 size_t round_blocks(std::byte* buf, size_t count) {
  alignas(16) uint16_t narrow[8];
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    auto* p = reinterpret_cast<float*>(buf + 4 * i);
    Half::store(narrow, _mm256_loadu_ps(p));
    _mm256_storeu_ps(p, Half::load(narrow));
  }
  return i;
}

template <typename Half>
TGPG_AVX2 size_t widen_blocks(std::byte* dst, const std::byte* src, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(reinterpret_cast<float*>(dst + 4 * i), Half::load(src + 2 * i));
  return i;
}

template <typename Half, typename Op>
TGPG_AVX2 size_t reduce_blocks(std::byte* dst, const std::byte* src, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    auto* d = reinterpret_cast<float*>(dst + 4 * i);
    _mm256_storeu_ps(d, Op::apply(_mm256_loadu_ps(d), Half::load(src + 2 * i)));
  }
  return i;
}

template <typename Half>
size_t reduce_blocks_for(std::byte* dst, const std::byte* src, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return reduce_blocks<Half, simd::Add>(dst, src, count);
    case ReduceOp::Product: return reduce_blocks<Half, simd::Mul>(dst, src, count);
    case ReduceOp::Min: return reduce_blocks<Half, simd::Min>(dst, src, count);
    case ReduceOp::Max: return reduce_blocks<Half, simd::Max>(dst, src, count);
    default: return 0;
  }
}

#define TGPG_WIRE_DISPATCH(wire, fn, ...)                                                       \
  (!have_avx2() ? size_t{0}                                                                     \
                : (wire) == DType::BFloat16 ? fn<simd::Bf16>(__VA_ARGS__) : fn<simd::Fp16>(__VA_ARGS__))
#else
#define TGPG_WIRE_DISPATCH(wire, fn, ...) size_t{0}
#endif

void check_wire(DType wire) {
  if (!is_wire_dtype(wire)) {
    throw std::logic_error(std::string("float32 cannot travel as ") + dtype_name(wire));
  }
}

}  // namespace

bool is_wire_dtype(DType wire) { return wire == DType::BFloat16 || wire == DType::Float16; }

void narrow_to_wire(std::byte* dst, const std::byte* src, size_t count, DType wire) {
  check_wire(wire);
  for (size_t i = TGPG_WIRE_DISPATCH(wire, narrow_blocks, dst, src, count); i < count; ++i) {
    store_u16(dst + 2 * i, narrow_one(load_float(src + 4 * i), wire));
  }
}

void round_through_wire(std::byte* buf, size_t count, DType wire) {
  check_wire(wire);
  for (size_t i = TGPG_WIRE_DISPATCH(wire, round_blocks, buf, count); i < count; ++i) {
    store_float(buf + 4 * i, widen_one(narrow_one(load_float(buf + 4 * i), wire), wire));
  }
}

void widen_from_wire(std::byte* dst, const std::byte* src, size_t count, DType wire) {
  check_wire(wire);
  for (size_t i = TGPG_WIRE_DISPATCH(wire, widen_blocks, dst, src, count); i < count; ++i) {
    store_float(dst + 4 * i, widen_one(load_u16(src + 2 * i), wire));
  }
}

void reduce_from_wire(std::byte* dst, const std::byte* src, size_t count, DType wire, ReduceOp op) {
  check_wire(wire);
  for (size_t i = TGPG_WIRE_DISPATCH(wire, reduce_blocks_for, dst, src, count, op); i < count; ++i) {
    store_float(dst + 4 * i, apply(op, load_float(dst + 4 * i), widen_one(load_u16(src + 2 * i), wire)));
  }
}

}  // namespace tgpg
