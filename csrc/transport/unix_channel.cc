#include "transport/unix_channel.h"

#include <grpcpp/create_channel_posix.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "transport/endpoint.h"

namespace tgpg {
namespace {

// Closes the socket unless it was handed on.
class SocketFd {
 public:
  explicit SocketFd(int fd) : fd_(fd) {}
  ~SocketFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  SocketFd(const SocketFd&) = delete;
  SocketFd& operator=(const SocketFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

std::shared_ptr<grpc::Channel> dial_unix_socket(const std::string& target, const TransportConfig& config,
                                                const grpc::ChannelArguments& args, std::string* retryable_error,
                                                std::optional<PeerProcess>* peer) {
#ifdef GPR_SUPPORT_CHANNELS_FROM_FD
  const std::string path = target.substr(sizeof(kUnixScheme) - 1);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    throw std::runtime_error("the unix socket path " + path + " is too long");
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  SocketFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throw std::runtime_error(std::string("could not create a unix socket: ") + std::strerror(errno));
  // The kernel doubles the value and caps it at net.core.wmem_max; a smaller
  // buffer than asked for still works, only slower.
  const int send_buffer = static_cast<int>(std::min<size_t>(config.max_payload_bytes, 1 << 30));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof(send_buffer));
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    const std::string what = "could not connect to " + target + ": " + std::strerror(error);
    // Not listening yet (or any more): the peer's server may still be starting.
    if (error == ENOENT || error == ECONNREFUSED || error == EAGAIN) {
      *retryable_error = what;
      return nullptr;
    }
    throw std::runtime_error(what);
  }
  // A rank's socket lies in a directory that only its user may enter; a
  // socket of another user's at the published path is no rank of this job.
  const std::optional<PeerProcess> listener = unix_socket_peer(fd.get());
  if (!listener || listener->uid != ::geteuid()) {
    throw std::runtime_error("the process listening at " + target + " belongs to another user; the address in the "
                             "store is not a rank's of this job");
  }
  if (peer != nullptr) *peer = listener;
  // gRPC owns the socket from here, and closes it with the channel.
  return grpc::CreateCustomInsecureChannelFromFd(target, fd.release(), args);
#else
  throw std::runtime_error("this gRPC build cannot make channels from sockets");
#endif
}

}  // namespace tgpg
