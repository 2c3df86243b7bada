// tgpg::replace_file: a file that threads rewrite at once, and a reader, only
// ever see one writer's whole content.

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "transport/replace_file.h"

namespace tgpg_test {
namespace {

namespace fs = std::filesystem;

class ReplaceFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "replace_file_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream content;
    content << in.rdbuf();
    return content.str();
  }

  fs::path dir_;
};

// Writer i writes i+1 copies of its letter: lengths differ, so a truncating
// writer that lost a race would leave a longer writer's tail behind.
std::string content_of(int writer) { return std::string(4096 * (writer + 1), static_cast<char>('a' + writer)); }

bool is_whole_content(const std::string& seen, int writers) {
  for (int i = 0; i < writers; ++i) {
    if (seen == content_of(i)) return true;
  }
  return false;
}

TEST_F(ReplaceFile, WritesTheContent) {
  const fs::path path = dir_ / "record.json";
  ASSERT_TRUE(tgpg::replace_file(path.string(), "{\"rank\": 0}\n"));
  EXPECT_EQ(read(path), "{\"rank\": 0}\n");
  ASSERT_TRUE(tgpg::replace_file(path.string(), "{}"));
  EXPECT_EQ(read(path), "{}");
}

TEST_F(ReplaceFile, ConcurrentWritersAndAReaderSeeOnlyWholeContents) {
  const fs::path path = dir_ / "record.json";
  constexpr int kWriters = 4;
  constexpr int kRounds = 200;
  ASSERT_TRUE(tgpg::replace_file(path.string(), content_of(0)));
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done.load()) {
      if (!is_whole_content(read(path), kWriters)) torn.fetch_add(1);
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int round = 0; round < kRounds; ++round) EXPECT_TRUE(tgpg::replace_file(path.string(), content_of(w)));
    });
  }
  for (auto& writer : writers) writer.join();
  done.store(true);
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_TRUE(is_whole_content(read(path), kWriters));
  // No temporary is left behind: the directory holds the one file.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(ReplaceFile, AnUnwritableDirectoryLeavesNothingAndSaysSo) {
  EXPECT_FALSE(tgpg::replace_file((dir_ / "missing" / "record.json").string(), "{}"));
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
}

}  // namespace
}  // namespace tgpg_test
