#include "algorithms/half_kernels.h"

#include <cstdint>
#include <cstring>

#include "algorithms/half_simd.h"

namespace tgpg {

#ifdef TGPG_HAVE_X86_HALF_KERNELS
namespace {

using simd::Add;
using simd::Bf16;
using simd::bf16_round;
using simd::Fp16;
using simd::Max;
using simd::Min;
using simd::Mul;

// Returns how many leading elements it reduced (a multiple of 8); the caller finishes the rest.
template <typename Half, typename Op>
TGPG_AVX2 size_t reduce_blocks(void* dst_ptr, const void* src_ptr, size_t count) {
  auto* dst = static_cast<uint16_t*>(dst_ptr);
  const auto* src = static_cast<const unsigned char*>(src_ptr);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    Half::store(dst + i, Op::apply(Half::load(dst + i), Half::load(src + 2 * i)));
  }
  return i;
}

// bfloat16, sixteen at a time. Interleaving with zeros inside each 128-bit lane
// turns bfloat16 into float32 bit patterns without crossing lanes, and the
// saturating pack at the end undoes exactly that interleaving; this halves
// the shuffles per element against widening eight at a time.
template <typename Op>
TGPG_AVX2 size_t reduce_bf16_x16(void* dst_ptr, const void* src_ptr, size_t count) {
  auto* dst = static_cast<unsigned char*>(dst_ptr);
  const auto* src = static_cast<const unsigned char*>(src_ptr);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + 2 * i));
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    const __m256 lo = Op::apply(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, d)),
                                _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, s)));
    const __m256 hi = Op::apply(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, d)),
                                _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, s)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i),
                        _mm256_packus_epi32(bf16_round(lo), bf16_round(hi)));
  }
  return i + reduce_blocks<Bf16, Op>(dst + 2 * i, src + 2 * i, count - i);
}

template <typename Half>
size_t reduce_blocks_for(void* dst, const void* src, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return reduce_blocks<Half, Add>(dst, src, count);
    case ReduceOp::Product: return reduce_blocks<Half, Mul>(dst, src, count);
    case ReduceOp::Min: return reduce_blocks<Half, Min>(dst, src, count);
    case ReduceOp::Max: return reduce_blocks<Half, Max>(dst, src, count);
    default: return 0;
  }
}

}  // namespace
#endif

size_t reduce_half_vectorized(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
#ifdef TGPG_HAVE_X86_HALF_KERNELS
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (!supported) return 0;
  if (dtype == DType::Float16) return reduce_blocks_for<Fp16>(dst, src, count, op);
  if (dtype == DType::BFloat16) {
    switch (op) {
      case ReduceOp::Sum: return reduce_bf16_x16<Add>(dst, src, count);
      case ReduceOp::Product: return reduce_bf16_x16<Mul>(dst, src, count);
      case ReduceOp::Min: return reduce_bf16_x16<Min>(dst, src, count);
      case ReduceOp::Max: return reduce_bf16_x16<Max>(dst, src, count);
      default: return 0;
    }
  }
#endif
  return 0;
}

}  // namespace tgpg
