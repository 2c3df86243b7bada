#include "transport/unix_listener.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "transport/call_peer.h"
#include "transport/log.h"
#include "transport/thread_name.h"

namespace tgpg {
namespace {

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

UnixListener::UnixListener(const std::string& path, grpc::Server& server) : server_(server) {
#ifndef GPR_SUPPORT_CHANNELS_FROM_FD
  throw std::runtime_error("this gRPC build cannot serve connections it did not accept; set "
                           "TORCH_GRPC_PG_UNIX_SOCKETS=0");
#endif
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) throw std::runtime_error("the unix socket path " + path + " is too long");
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(system_error("could not create a unix socket"));
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::chmod(path.c_str(), 0600) != 0 || ::listen(fd_, SOMAXCONN) != 0) {
    const std::string error = system_error("could not listen on the unix socket " + path);
    ::close(fd_);
    throw std::runtime_error(error);
  }
  thread_ = std::thread([this] { run(); });
}

UnixListener::~UnixListener() {
  stopping_.store(true);
  // Wakes the accept below, which then fails.
  ::shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

void UnixListener::run() {
  name_this_thread("tgpg-accept");
  while (!stopping_.load()) {
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (stopping_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the connection waits in the backlog.
      log_warning(system_error("the rank's unix socket could not accept a connection") + "; trying again");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    // The socket's directory already keeps other users out; this says so again.
    const auto peer = unix_socket_peer(fd);
    if (!peer || peer->uid != ::geteuid()) {
      ::close(fd);
      continue;
    }
#ifdef GPR_SUPPORT_CHANNELS_FROM_FD
    grpc::AddInsecureChannelFromFd(&server_, fd);  // gRPC owns the descriptor from here
#endif
  }
}

}  // namespace tgpg
