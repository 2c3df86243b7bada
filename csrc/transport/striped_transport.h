#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/group_transport.h"

namespace tgpg {

// A group's collectives over several TCP connections to each peer on another
// host (TransportConfig::connections_per_peer). One TCP connection keeps at
// most the kernel's send buffer limit in flight (net.ipv4.tcp_wmem's maximum,
// 4 MiB by default, which an unprivileged process cannot raise), so on a long
// link it cannot reach the link's rate: 4 MiB per 100 ms round trip is 42 MB/s.
// K connections keep K times that in flight.
//
// Each connection is a GrpcMessenger of its own, under the group's key and
// "/c<k>" after it: its own stream, handshake and keys, so that the handshake
// binds every stream to one connection number and a relay cannot swap two
// streams' frames. The n-th frame to a peer goes on connection n mod K and the
// peer takes its n-th frame from the same connection, so frames still reach
// the algorithms in the order they were sent. The connections share the
// group's monitor, and fail together.
//
// Links within a host (a unix socket, the shared ring) keep one connection:
// they are not limited by a round trip. Receives from any source are not
// offered: they belong to the point-to-point transport, which has one
// connection per peer.
class StripedTransport : public GroupTransport {
 public:
  StripedTransport(const TransportConfig& config, const std::string& group_key, int rank, int world);
  ~StripedTransport() override;

  const std::string& group_key() const override { return first().group_key(); }
  GroupMonitor& monitor() override { return first().monitor(); }
  void expect(int src, const FrameHeader& expected) override;
  std::string local_endpoint() const override { return first().local_endpoint(); }
  void set_peer_endpoints(const std::vector<std::string>& endpoints) override;
  std::vector<std::string> host_ids() const override { return first().host_ids(); }
  void connect(int peer) override;
  std::optional<uint32_t> peer_pid(int peer) override { return first().peer_pid(peer); }

  void send(int dst, const FrameHeader& header, ByteView payload,
            const std::shared_ptr<SendTracker>& tracker) override;
  ReceivedFrame recv(int src, Deadline deadline) override;
  void abort_peers(const std::string& reason) override;

  void fail(const std::string& reason) override;
  bool failed() const override;
  std::string failure() const override;
  void add_failure_listener(std::function<void(const std::string&)> listener) override;
  int wait_any_source(Deadline deadline) override;
  bool has_frame(int src) const override;
  void shut_down() override;

 private:
  // Frames counted on one side of the link to one peer: which connection the
  // next one takes.
  struct Turn {
    mutable std::mutex mutex;
    uint64_t next = 0;
  };

  GroupTransport& first() const { return *connections_.front(); }
  // The connection the next frame between this rank and `peer` takes, under
  // `turn`'s lock: the first for a peer on a link within this host.
  GroupTransport& connection(int peer, const Turn& turn) const;

  std::vector<std::unique_ptr<GroupTransport>> connections_;
  bool unix_sockets_ = true;
  std::vector<bool> striped_;  // per peer: its link runs over TCP
  std::vector<Turn> sent_;     // per destination
  std::vector<Turn> received_;  // per source
};

}  // namespace tgpg
