#include "transport/endpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tgpg {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string Endpoint::serialize() const { return "v1\n" + machine + "\n" + tcp + "\n" + unix_path; }

Endpoint Endpoint::parse(const std::string& text) {
  std::istringstream in(text);
  std::string version;
  Endpoint e;
  std::getline(in, version);
  std::getline(in, e.machine);
  std::getline(in, e.tcp);
  std::getline(in, e.unix_path);
  if (version != "v1" || e.tcp.empty()) {
    throw std::runtime_error("a peer published an address this version cannot read ('" + text +
                             "'); install the same torch-grpc-pg release on every rank");
  }
  return e;
}

namespace {

std::string namespace_id(const char* path) {
  struct stat ns {};
  return ::stat(path, &ns) == 0 ? std::to_string(ns.st_ino) : std::string("-");
}

}  // namespace

// Processes in other network namespaces stand for other hosts (containers,
// test setups), so they count as other machines even where a shared file
// system would let them reach the socket.
std::string local_machine_id() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string(host) + "/" + first_line("/proc/sys/kernel/random/boot_id") + "/" +
         namespace_id("/proc/self/ns/mnt") + "/" + namespace_id("/proc/self/ns/net");
}

std::string default_advertise_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "127.0.0.1";
  return host;
}

std::string dial_target(const Endpoint& self, const Endpoint& peer, bool unix_sockets) {
  if (unix_sockets && !peer.unix_path.empty() && peer.machine == self.machine) return kUnixScheme + peer.unix_path;
  return peer.tcp;
}

}  // namespace tgpg
