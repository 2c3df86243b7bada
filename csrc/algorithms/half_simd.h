#pragma once

// AVX2/F16C building blocks shared by the half-precision reduction kernels
// (half_kernels.cc) and the wire-dtype kernels (wire_kernels.cc): loads and
// stores of eight float16 or bfloat16 values as float32, and the reductions
// in float32. Only for translation units that check the CPU at run time.

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TGPG_HAVE_X86_HALF_KERNELS 1
#endif

#ifdef TGPG_HAVE_X86_HALF_KERNELS
namespace tgpg {
namespace simd {

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

}  // namespace simd
}  // namespace tgpg
#endif
