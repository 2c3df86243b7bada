#include "algorithms/copy_kernels.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tgpg {

void copy_past_cache(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
#if defined(__x86_64__)
  // SSE2 is in every x86-64 CPU, and 16-byte streaming stores already fill
  // the memory bus: 32-byte ones measured no faster, so there is nothing to dispatch.
  constexpr size_t kVector = 16;
  constexpr size_t kUnroll = 4 * kVector;
  const size_t misalignment = reinterpret_cast<uintptr_t>(out) % kVector;
  const size_t head = misalignment == 0 ? 0 : kVector - misalignment;
  if (bytes < head + kUnroll) {
    if (bytes > 0) std::memcpy(out, in, bytes);
    return;
  }
  std::memcpy(out, in, head);
  size_t done = head;
  for (; done + kUnroll <= bytes; done += kUnroll) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + kVector));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 2 * kVector));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 3 * kVector));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + kVector), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 2 * kVector), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 3 * kVector), d);
  }
  // Streaming stores are weakly ordered: fence them before anything that
  // tells another thread the data is there.
  _mm_sfence();
  if (done < bytes) std::memcpy(out + done, in + done, bytes - done);
#else
  if (bytes > 0) std::memcpy(out, in, bytes);
#endif
}

}  // namespace tgpg
