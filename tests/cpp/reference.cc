#include "reference.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "elements.h"

namespace tgpg_test {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [lo, hi), with a float32's worth of random mantissa bits.
double uniform(uint64_t& state, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(splitmix(state) >> 40) / static_cast<double>(1ULL << 24);
}

double combine_floating(tgpg::ReduceOp op, double a, double b) {
  switch (op) {
    case tgpg::ReduceOp::Sum: return a + b;
    case tgpg::ReduceOp::Product: return a * b;
    case tgpg::ReduceOp::Min: return std::min(a, b);
    case tgpg::ReduceOp::Max: return std::max(a, b);
    default: throw std::logic_error("bitwise reduction of floating values");
  }
}

// In uint64_t, where overflow wraps; store_integer then keeps the low bits,
// which is where wrap-around in a narrower type leaves them as well. uint64
// values arrive as bit patterns (load_integer), so they compare unsigned.
int64_t combine_integer(tgpg::DType dtype, tgpg::ReduceOp op, int64_t a, int64_t b) {
  const auto ua = static_cast<uint64_t>(a);
  const auto ub = static_cast<uint64_t>(b);
  const bool unsigned64 = dtype == tgpg::DType::UInt64;
  switch (op) {
    case tgpg::ReduceOp::Sum: return static_cast<int64_t>(ua + ub);
    case tgpg::ReduceOp::Product: return static_cast<int64_t>(ua * ub);
    case tgpg::ReduceOp::Min: return unsigned64 ? static_cast<int64_t>(std::min(ua, ub)) : std::min(a, b);
    case tgpg::ReduceOp::Max: return unsigned64 ? static_cast<int64_t>(std::max(ua, ub)) : std::max(a, b);
    case tgpg::ReduceOp::BitAnd: return static_cast<int64_t>(ua & ub);
    case tgpg::ReduceOp::BitOr: return static_cast<int64_t>(ua | ub);
    case tgpg::ReduceOp::BitXor: return static_cast<int64_t>(ua ^ ub);
  }
  throw std::logic_error("unknown reduce op");
}

}  // namespace

std::vector<std::byte> make_input(tgpg::DType dtype, tgpg::ReduceOp op, uint64_t seed, size_t count) {
  const size_t size = tgpg::element_size(dtype);
  std::vector<std::byte> out(count * size);
  uint64_t state = seed * 0x2545f4914f6cdd1dULL + 1;
  for (size_t i = 0; i < count; ++i) {
    std::byte* p = out.data() + i * size;
    if (!tgpg::is_floating(dtype)) {
      store_integer(dtype, static_cast<int64_t>(splitmix(state)), p);
      continue;
    }
    switch (op) {
      case tgpg::ReduceOp::Sum: store_floating(dtype, uniform(state, -10, 10), p); break;
      case tgpg::ReduceOp::Product: store_floating(dtype, uniform(state, 0.5, 2), p); break;
      default: store_floating(dtype, uniform(state, -1000, 1000), p); break;
    }
  }
  return out;
}

std::vector<std::byte> make_bytes(uint64_t seed, size_t size) {
  std::vector<std::byte> out(size);
  uint64_t state = seed * 0x5851f42d4c957f2dULL + 7;
  for (auto& b : out) b = static_cast<std::byte>(splitmix(state));
  return out;
}

::testing::AssertionResult matches_reduction(tgpg::DType dtype, tgpg::ReduceOp op,
                                             const std::vector<const std::byte*>& inputs,
                                             const std::byte* got, size_t count) {
  const size_t size = tgpg::element_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    const size_t at = i * size;
    if (!tgpg::is_floating(dtype)) {
      int64_t expected = load_integer(dtype, inputs[0] + at);
      for (size_t r = 1; r < inputs.size(); ++r) expected = combine_integer(dtype, op, expected, load_integer(dtype, inputs[r] + at));
      std::byte narrowed[8];
      store_integer(dtype, expected, narrowed);
      expected = load_integer(dtype, narrowed);
      const int64_t actual = load_integer(dtype, got + at);
      if (actual != expected) {
        auto failure = ::testing::AssertionFailure();
        failure << tgpg::dtype_name(dtype) << " " << tgpg::reduce_op_name(op) << ": element " << i << " is ";
        // A uint64 comes back from load_integer as its bit pattern.
        if (dtype == tgpg::DType::UInt64) {
          return failure << static_cast<uint64_t>(actual) << ", expected " << static_cast<uint64_t>(expected);
        }
        return failure << actual << ", expected " << expected;
      }
      continue;
    }
    double expected = load_floating(dtype, inputs[0] + at);
    double magnitude = std::fabs(expected);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const double x = load_floating(dtype, inputs[r] + at);
      expected = combine_floating(op, expected, x);
      magnitude += std::fabs(x);
    }
    // Each of the world - 1 combining steps, and the final store, may round
    // once by at most the unit roundoff of what it produced.
    const double u = unit_roundoff(dtype);
    const double steps = static_cast<double>(inputs.size());
    double tolerance = 0;
    if (op == tgpg::ReduceOp::Sum) tolerance = 2 * steps * u * magnitude;
    if (op == tgpg::ReduceOp::Product) tolerance = 2 * steps * u * std::fabs(expected);
    const double actual = load_floating(dtype, got + at);
    if (!(std::fabs(actual - expected) <= tolerance)) {
      std::ostringstream out;
      out.precision(17);
      out << tgpg::dtype_name(dtype) << " " << tgpg::reduce_op_name(op) << " over " << inputs.size()
          << " ranks: element " << i << " is " << actual << ", expected " << expected << " within " << tolerance;
      return ::testing::AssertionFailure() << out.str();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tgpg_test
