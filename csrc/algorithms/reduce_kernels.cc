#include "algorithms/reduce_kernels.h"

#include "algorithms/half_kernels.h"
#include "algorithms/half_scalar.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tgpg {
namespace {

// The kernels are compiled twice on x86-64, once for AVX2/F16C machines, and the
// loader picks the variant that the CPU runs. Everything else gets the default.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TGPG_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TGPG_MULTIVERSION
#endif

template <typename T>
inline T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

struct SumF {
  template <typename T> static T apply(T a, T b) { return a + b; }
};
struct ProdF {
  template <typename T> static T apply(T a, T b) { return a * b; }
};
// NaN wins, as in torch.minimum / torch.maximum.
struct MinF {
  template <typename T> static T apply(T a, T b) { return (b < a || b != b) ? b : a; }
};
struct MaxF {
  template <typename T> static T apply(T a, T b) { return (b > a || b != b) ? b : a; }
};
struct AndF {
  template <typename T> static T apply(T a, T b) { return a & b; }
};
struct OrF {
  template <typename T> static T apply(T a, T b) { return a | b; }
};
struct XorF {
  template <typename T> static T apply(T a, T b) { return a ^ b; }
};

// Signed overflow is undefined in C++; wrap-around, as torch does, needs
// unsigned maths. Types narrower than unsigned int would be promoted to int
// (where 65535 * 65535 overflows), so those are widened to unsigned int.
template <typename T, typename F>
struct Wrapping {
  static T apply(T a, T b) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(F::apply(static_cast<U>(static_cast<std::make_unsigned_t<T>>(a)),
                                   static_cast<U>(static_cast<std::make_unsigned_t<T>>(b))));
  }
};

template <typename T, typename F>
TGPG_MULTIVERSION void reduce_plain(T* dst, const std::byte* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F::apply(dst[i], load<T>(src + i * sizeof(T)));
}

template <typename F>
TGPG_MULTIVERSION void reduce_bf16(uint16_t* dst, const std::byte* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float a = bf16_to_float(dst[i]);
    float b = bf16_to_float(load<uint16_t>(src + 2 * i));
    dst[i] = float_to_bf16(F::apply(a, b));
  }
}

#if defined(__FLT16_MAX__)
template <typename F>
TGPG_MULTIVERSION void reduce_f16(uint16_t* dst_bits, const std::byte* src, size_t n) {
  auto* dst = reinterpret_cast<_Float16*>(dst_bits);
  for (size_t i = 0; i < n; ++i) {
    float a = static_cast<float>(dst[i]);
    float b = static_cast<float>(load<_Float16>(src + 2 * i));
    dst[i] = static_cast<_Float16>(F::apply(a, b));
  }
}
#else
#error "torch-grpc-pg needs a compiler with _Float16 (GCC >= 12 or Clang >= 15)"
#endif

template <typename F>
void reduce_bool(uint8_t* dst, const std::byte* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t a = dst[i] != 0;
    const uint8_t b = load<uint8_t>(src + i) != 0;
    dst[i] = F::apply(a, b);
  }
}

template <typename T>
void reduce_integer(void* dst, const std::byte* src, size_t n, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::Sum: return reduce_plain<T, Wrapping<T, SumF>>(d, src, n);
    case ReduceOp::Product: return reduce_plain<T, Wrapping<T, ProdF>>(d, src, n);
    case ReduceOp::Min: return reduce_plain<T, MinF>(d, src, n);
    case ReduceOp::Max: return reduce_plain<T, MaxF>(d, src, n);
    case ReduceOp::BitAnd: return reduce_plain<T, AndF>(d, src, n);
    case ReduceOp::BitOr: return reduce_plain<T, OrF>(d, src, n);
    case ReduceOp::BitXor: return reduce_plain<T, XorF>(d, src, n);
  }
}

template <typename T>
void reduce_float(void* dst, const std::byte* src, size_t n, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::Sum: return reduce_plain<T, SumF>(d, src, n);
    case ReduceOp::Product: return reduce_plain<T, ProdF>(d, src, n);
    case ReduceOp::Min: return reduce_plain<T, MinF>(d, src, n);
    case ReduceOp::Max: return reduce_plain<T, MaxF>(d, src, n);
    default: throw std::logic_error("bitwise reduction on a floating-point dtype");
  }
}

template <template <typename> class Kernel, typename Elem>
void reduce_half(void* dst, const std::byte* src, size_t n, DType dtype, ReduceOp op) {
  const size_t done = reduce_half_vectorized(dst, src, n, dtype, op);
  auto* d = static_cast<Elem*>(dst) + done;
  src += done * sizeof(Elem);
  n -= done;
  switch (op) {
    case ReduceOp::Sum: return Kernel<SumF>::run(d, src, n);
    case ReduceOp::Product: return Kernel<ProdF>::run(d, src, n);
    case ReduceOp::Min: return Kernel<MinF>::run(d, src, n);
    case ReduceOp::Max: return Kernel<MaxF>::run(d, src, n);
    default: throw std::logic_error("bitwise reduction on a floating-point dtype");
  }
}

template <typename F>
struct Bf16Kernel {
  static void run(uint16_t* d, const std::byte* s, size_t n) { reduce_bf16<F>(d, s, n); }
};
template <typename F>
struct F16Kernel {
  static void run(uint16_t* d, const std::byte* s, size_t n) { reduce_f16<F>(d, s, n); }
};

}  // namespace

bool reduction_supported(DType dtype, ReduceOp op) {
  const bool bitwise = op == ReduceOp::BitAnd || op == ReduceOp::BitOr || op == ReduceOp::BitXor;
  return is_reducible(dtype) && !(bitwise && is_floating(dtype));
}

void reduce_into(void* dst, const void* src_ptr, size_t count, DType dtype, ReduceOp op) {
  // Moved only: the backend refuses to reduce them at the call.
  if (!is_reducible(dtype)) {
    throw std::logic_error(std::string("reduce_into: ") + dtype_name(dtype) + " is moved only");
  }
  if (count == 0) return;
  const auto* src = static_cast<const std::byte*>(src_ptr);
  switch (dtype) {
    case DType::Float32: return reduce_float<float>(dst, src, count, op);
    case DType::Float64: return reduce_float<double>(dst, src, count, op);
    case DType::BFloat16: return reduce_half<Bf16Kernel, uint16_t>(dst, src, count, dtype, op);
    case DType::Float16: return reduce_half<F16Kernel, uint16_t>(dst, src, count, dtype, op);
    case DType::Int8: return reduce_integer<int8_t>(dst, src, count, op);
    case DType::Int16: return reduce_integer<int16_t>(dst, src, count, op);
    case DType::Int32: return reduce_integer<int32_t>(dst, src, count, op);
    case DType::Int64: return reduce_integer<int64_t>(dst, src, count, op);
    case DType::UInt8: return reduce_integer<uint8_t>(dst, src, count, op);
    case DType::UInt16: return reduce_integer<uint16_t>(dst, src, count, op);
    case DType::UInt32: return reduce_integer<uint32_t>(dst, src, count, op);
    case DType::UInt64: return reduce_integer<uint64_t>(dst, src, count, op);
    case DType::Bool: {
      auto* d = static_cast<uint8_t*>(dst);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Max:
        case ReduceOp::BitOr: return reduce_bool<OrF>(d, src, count);
        case ReduceOp::Product:
        case ReduceOp::Min:
        case ReduceOp::BitAnd: return reduce_bool<AndF>(d, src, count);
        case ReduceOp::BitXor: return reduce_bool<XorF>(d, src, count);
      }
      break;
    }
    default:
      break;  // is_reducible() lists every dtype
  }
  throw std::logic_error(std::string("reduce_into: unhandled dtype ") + dtype_name(dtype));
}

}  // namespace tgpg
