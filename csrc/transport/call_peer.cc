#include "transport/call_peer.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace tgpg {

std::optional<PeerProcess> unix_socket_peer(int fd) {
  int domain = 0;
  socklen_t size = sizeof(domain);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) != 0 || domain != AF_UNIX) return std::nullopt;
  ucred credentials{};
  size = sizeof(credentials);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) return std::nullopt;
  return PeerProcess{credentials.pid, credentials.uid};
}

CallPeer identify_call_peer(const std::string& grpc_peer) {
  if (grpc_peer.rfind("ipv4:", 0) == 0 || grpc_peer.rfind("ipv6:", 0) == 0) return CallPeer{LinkKind::Tcp, {}};
  if (grpc_peer.rfind("fd:", 0) == 0) {
    const std::string digits = grpc_peer.substr(3);
    char* end = nullptr;
    errno = 0;
    const long fd = std::strtol(digits.c_str(), &end, 10);
    if (!digits.empty() && *end == '\0' && errno == 0 && fd >= 0 && fd <= INT32_MAX) {
      if (auto process = unix_socket_peer(static_cast<int>(fd))) return CallPeer{LinkKind::Unix, process};
    }
  }
  throw std::runtime_error("a connection of an unknown kind (" + grpc_peer + ")");
}

}  // namespace tgpg
