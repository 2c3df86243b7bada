// copy_past_cache must copy exactly like memcpy at every alignment and length,
// including the unaligned head and the tail shorter than one unrolled step.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "algorithms/copy_kernels.h"

namespace tgpg_test {
namespace {

TEST(CopyPastCache, MatchesMemcpyAtEveryAlignmentAndLength) {
  constexpr size_t kGuard = 64;
  std::vector<std::byte> src(4096 + 2 * kGuard);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + 7);
  for (size_t src_shift : {0, 1, 8, 15}) {
    for (size_t dst_shift : {0, 1, 3, 8, 15, 16}) {
      for (size_t bytes : {0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 4096}) {
        SCOPED_TRACE(testing::Message() << "src+" << src_shift << " dst+" << dst_shift << " bytes " << bytes);
        std::vector<std::byte> dst(bytes + 2 * kGuard, std::byte{0xAB});
        const size_t at = kGuard + dst_shift;
        tgpg::copy_past_cache(dst.data() + at, src.data() + src_shift, bytes);
        ASSERT_EQ(std::memcmp(dst.data() + at, src.data() + src_shift, bytes), 0);
        // Nothing around the destination is touched.
        for (size_t i = 0; i < dst.size(); ++i) {
          if (i < at || i >= at + bytes) {
            ASSERT_EQ(dst[i], std::byte{0xAB}) << "byte " << i;
          }
        }
      }
    }
  }
}

TEST(CopyPastCache, ZeroElementsWithNullPointers) { tgpg::copy_past_cache(nullptr, nullptr, 0); }

}  // namespace
}  // namespace tgpg_test
