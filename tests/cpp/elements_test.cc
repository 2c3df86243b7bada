// The reference conversions of elements.cc, checked against the compiler's
// own _Float16 and against known bit patterns, since every half-precision
// check of the collectives leans on them.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "elements.h"

namespace tgpg_test {
namespace {

uint16_t bits_of(tgpg::DType dtype, double value) {
  std::byte b[2];
  store_floating(dtype, value, b);
  uint16_t out;
  std::memcpy(&out, b, 2);
  return out;
}

TEST(Elements, Float16AgreesWithTheCompiler) {
  for (int i = -200000; i <= 200000; ++i) {
    // Between representable values, and beyond 65504 too. A float to begin
    // with, so that the compiler's conversion rounds only once, as ours does.
    const double value = static_cast<float>(i * 0.3371);
    const auto expected = static_cast<_Float16>(static_cast<float>(value));
    uint16_t expected_bits;
    std::memcpy(&expected_bits, &expected, 2);
    ASSERT_EQ(bits_of(tgpg::DType::Float16, value), expected_bits) << value;
    if (std::isfinite(static_cast<float>(expected))) {
      std::byte b[2];
      std::memcpy(b, &expected_bits, 2);
      ASSERT_EQ(load_floating(tgpg::DType::Float16, b), static_cast<double>(static_cast<float>(expected)));
    }
  }
}

TEST(Elements, Float16KnownValues) {
  EXPECT_EQ(bits_of(tgpg::DType::Float16, 1.0), 0x3c00);
  EXPECT_EQ(bits_of(tgpg::DType::Float16, -2.0), 0xc000);
  EXPECT_EQ(bits_of(tgpg::DType::Float16, 65504.0), 0x7bff);
  EXPECT_EQ(bits_of(tgpg::DType::Float16, std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(bits_of(tgpg::DType::Float16, 1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie to even
}

TEST(Elements, BFloat16KnownValues) {
  EXPECT_EQ(bits_of(tgpg::DType::BFloat16, 1.0), 0x3f80);
  EXPECT_EQ(bits_of(tgpg::DType::BFloat16, -2.0), 0xc000);
  EXPECT_EQ(bits_of(tgpg::DType::BFloat16, 1.0 + std::ldexp(1.0, -8)), 0x3f80);  // tie to even
  EXPECT_EQ(bits_of(tgpg::DType::BFloat16, 1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);  // tie to even, upwards
  std::byte b[2];
  store_floating(tgpg::DType::BFloat16, 3.140625, b);
  EXPECT_EQ(load_floating(tgpg::DType::BFloat16, b), 3.140625);
}

TEST(Elements, IntegersWrapToTheirWidth) {
  std::byte b[8];
  store_integer(tgpg::DType::Int8, 300, b);
  EXPECT_EQ(load_integer(tgpg::DType::Int8, b), 44);
  store_integer(tgpg::DType::UInt8, -1, b);
  EXPECT_EQ(load_integer(tgpg::DType::UInt8, b), 255);
  store_integer(tgpg::DType::Int32, int64_t{1} << 31, b);
  EXPECT_EQ(load_integer(tgpg::DType::Int32, b), -(int64_t{1} << 31));
}

}  // namespace
}  // namespace tgpg_test
