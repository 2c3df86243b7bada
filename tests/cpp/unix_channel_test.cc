// dial_unix_socket: which failures a rank retries while its peer's server
// starts.

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "transport/unix_channel.h"

namespace tgpg_test {
namespace {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/tgpg-unix-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    ::unlink((path_ + "/bound.sock").c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

tgpg::TransportConfig plain_config() {
  tgpg::TransportConfig config;
  config.max_payload_bytes = 2 << 20;
  return config;
}

TEST(UnixChannel, AMissingSocketIsRetriedWithTheReason) {
  TempDir dir;
  const std::string target = "unix:" + dir.path() + "/nobody.sock";
  std::string error;
  EXPECT_EQ(tgpg::dial_unix_socket(target, plain_config(), grpc::ChannelArguments(), &error), nullptr);
  EXPECT_NE(error.find(target), std::string::npos) << error;
}

TEST(UnixChannel, ASocketNobodyListensOnIsRetried) {
  TempDir dir;
  const std::string path = dir.path() + "/bound.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  std::string error;
  EXPECT_EQ(tgpg::dial_unix_socket("unix:" + path, plain_config(), grpc::ChannelArguments(), &error), nullptr);
  EXPECT_FALSE(error.empty());
  ::close(fd);
}

TEST(UnixChannel, APathTooLongForTheKernelIsAnError) {
  std::string error;
  const std::string target = "unix:/tmp/" + std::string(200, 'x');
  EXPECT_THROW(tgpg::dial_unix_socket(target, plain_config(), grpc::ChannelArguments(), &error), std::runtime_error);
  EXPECT_TRUE(error.empty());
}

}  // namespace
}  // namespace tgpg_test
