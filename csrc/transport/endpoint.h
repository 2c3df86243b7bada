#pragma once

#include <string>

namespace tgpg {

// Where a rank can be reached, as published in the c10d store. Peers in the
// same mount and network namespaces of the same boot dial the unix socket;
// others dial TCP.
struct Endpoint {
  std::string machine;    // identifies this boot and mount namespace
  std::string tcp;        // "host:port"
  std::string unix_path;  // empty when unix sockets are off

  std::string serialize() const;
  static Endpoint parse(const std::string& text);
};

// gRPC's scheme for unix-socket addresses: dial targets and the peer address a
// server sees for a caller that came over its unix socket.
constexpr char kUnixScheme[] = "unix:";
inline bool is_unix_address(const std::string& address) { return address.rfind(kUnixScheme, 0) == 0; }

// The identity of this machine for Endpoint::machine.
std::string local_machine_id();

// A hostname that peers can resolve to this machine.
std::string default_advertise_host();

// The gRPC target to dial `peer` from a rank whose endpoint is `self`.
std::string dial_target(const Endpoint& self, const Endpoint& peer, bool unix_sockets);

}  // namespace tgpg
