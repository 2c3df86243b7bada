#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "transport/auth.h"

namespace tgpg {

// The process at the other end of a unix socket, as the kernel tells it.
struct PeerProcess {
  pid_t pid = 0;
  uid_t uid = 0;
};

// How a call reached this rank's server, from gRPC's peer string: over TCP
// ("ipv4:…", "ipv6:…"), or over the rank's unix socket, whose connections the
// rank accepts itself (UnixListener) and hands to gRPC, which then names each
// by its descriptor ("fd:N"). For those the kernel tells which process
// connected; a call holds its connection, and so that descriptor, open.
struct CallPeer {
  LinkKind kind = LinkKind::Tcp;
  std::optional<PeerProcess> process;  // for the unix socket only
};

// Throws std::runtime_error for a peer string of any other form.
CallPeer identify_call_peer(const std::string& grpc_peer);

// The process connected to the unix socket `fd`; nullopt if `fd` is not one.
std::optional<PeerProcess> unix_socket_peer(int fd);

}  // namespace tgpg
