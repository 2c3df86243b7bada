#include "algorithms/half_kernels.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TGPG_HAVE_X86_HALF_KERNELS 1
#endif

namespace tgpg {

#ifdef TGPG_HAVE_X86_HALF_KERNELS
namespace {

#define TGPG_AVX2 __attribute__((target("avx2,f16c,fma")))

struct Fp16 {
  TGPG_AVX2 static __m256 load(const void* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  TGPG_AVX2 static void store(void* p, __m256 v) {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// Rounds float32 to the nearest even bfloat16, left in the low half of each
// 32-bit lane; NaNs stay (quiet) NaNs.
TGPG_AVX2 inline __m256i bf16_round(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

struct Bf16 {
  TGPG_AVX2 static __m256 load(const void* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  TGPG_AVX2 static void store(void* p, __m256 v) {
    const __m256i out = bf16_round(v);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));
    _mm_storeu_si128(static_cast<__m128i*>(p), packed);
  }
};

struct Add {
  TGPG_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
};
struct Mul {
  TGPG_AVX2 static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};
// NaN wins, as in torch.minimum / torch.maximum and the scalar kernels.
struct Min {
  TGPG_AVX2 static __m256 apply(__m256 a, __m256 b) {
    const __m256 take_b = _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_LT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(a, b, take_b);
  }
};
struct Max {
  TGPG_AVX2 static __m256 apply(__m256 a, __m256 b) {
    const __m256 take_b = _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(a, b, take_b);
  }
};

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
