#pragma once

// The transport as the backend glue sees it. This header includes neither gRPC
// nor protobuf, so that translation units compiled against torch's headers
// (which ship their own protobuf) never meet the system's.

#include <functional>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/messenger.h"
#include "transport/group_monitor.h"
#include "transport/transport_config.h"

namespace tgpg {

class GroupTransport : public Messenger {
 public:
  virtual const std::string& group_key() const = 0;
  // Counters, the wait in progress and the flight recorder, for observers.
  virtual GroupMonitor& monitor() = 0;
  // What to publish in the store so that peers can reach this rank.
  virtual std::string local_endpoint() const = 0;
  // Every rank's published endpoint, in rank order; once, before the first send.
  virtual void set_peer_endpoints(const std::vector<std::string>& endpoints) = 0;
  // Names each rank's host (an opaque text: equal names share a host), from the
  // endpoints; after set_peer_endpoints.
  virtual std::vector<std::string> host_ids() const = 0;
  // Connects and handshakes now rather than at the first send, so that
  // address problems surface while the group is created.
  virtual void connect(int peer) = 0;
  // The process at the other end of this rank's link to `peer`, when the link
  // runs over this host's unix socket (the kernel's word for it); nothing
  // otherwise, or before the link is open.
  virtual std::optional<uint32_t> peer_pid(int peer) = 0;

  // Marks the group failed: every wait, now and later, throws `reason`. The
  // first failure, whether it came from here or from the transport itself
  // (a broken link, a malformed frame, a peer's abort), is sent on to every
  // peer, so that nobody waits out a timeout for a rank that has failed.
  virtual void fail(const std::string& reason) = 0;
  virtual bool failed() const = 0;
  virtual std::string failure() const = 0;
  // Also runs on the first failure, after peers have been told: a group with
  // two transports (collectives, point-to-point) fails both together.
  // Add listeners before the group's address is published.
  virtual void add_failure_listener(std::function<void(const std::string&)> listener) = 0;

  // For receives from any source: a peer whose next frame has arrived, and
  // whether one has. Throw as recv() does.
  virtual int wait_any_source(Deadline deadline) = 0;
  virtual bool has_frame(int src) const = 0;
  // Closes every stream, all at once and within about a second; the group
  // cannot be used afterwards.
  virtual void shut_down() = 0;
};

// The settings of this process's gRPC server while one runs. Every group of a
// process shares it, so later groups inherit its security settings.
std::optional<TransportConfig> running_server_config();

// Starts (or joins) this process's gRPC server and registers the group there.
// Throws std::invalid_argument, naming the field, when `config` asks for
// security or listening settings other than those of the running server.
std::unique_ptr<GroupTransport> create_group_transport(const TransportConfig& config,
                                                       const std::string& group_key, int rank, int world);

}  // namespace tgpg
