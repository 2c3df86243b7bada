// for_each_element_run must hand every element over exactly once, in order,
// however the network split the bytes.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "algorithms/element_runs.h"

namespace tgpg_test {
namespace {

// Reassembles what for_each_element_run reports, checking that runs are
// contiguous and consist of whole elements.
std::vector<std::byte> reassemble(const std::vector<tgpg::ByteView>& views, size_t element_bytes) {
  std::vector<std::byte> out;
  size_t expected_first = 0;
  tgpg::for_each_element_run(views, element_bytes, [&](size_t first, const std::byte* p, size_t n) {
    EXPECT_EQ(first, expected_first);
    EXPECT_GT(n, 0u);
    out.insert(out.end(), p, p + n * element_bytes);
    expected_first = first + n;
  });
  return out;
}

TEST(ElementRuns, ManySplitsOfSmallBuffers) {
  uint64_t state = 12345;
  for (size_t element_bytes : {1, 2, 4, 8}) {
    std::vector<std::byte> data(element_bytes * 5);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 + 1);
    for (int trial = 0; trial < 2000; ++trial) {
      // A cut after each byte with probability 1/3, and now and then an
      // empty view, which a transport might produce at a slice boundary.
      std::vector<tgpg::ByteView> views;
      size_t begin = 0;
      for (size_t i = 0; i + 1 < data.size(); ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const uint64_t r = state >> 33;
        if (r % 3 == 0) {
          views.push_back({data.data() + begin, i + 1 - begin});
          begin = i + 1;
        }
        if (r % 17 == 0) views.push_back({data.data() + begin, 0});
      }
      views.push_back({data.data() + begin, data.size() - begin});
      ASSERT_EQ(reassemble(views, element_bytes), data) << "element size " << element_bytes << ", trial " << trial;
    }
  }
}

TEST(ElementRuns, EmptyViewsAndNoViews) {
  std::vector<std::byte> data(8, std::byte{3});
  EXPECT_TRUE(reassemble({}, 4).empty());
  std::vector<tgpg::ByteView> views = {{data.data(), 0}, {data.data(), 3}, {data.data() + 3, 0}, {data.data() + 3, 5}};
  EXPECT_EQ(reassemble(views, 4), data);
}

}  // namespace
}  // namespace tgpg_test
