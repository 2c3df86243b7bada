#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "transport/transport_config.h"

namespace tgpg {

struct LinkIdentity {
  std::string group_key;
  int src_rank;
  int dst_rank;
  int world_size;
};

// This rank's one stream to one peer: opens an Exchange stream, runs the
// handshake that authenticates both ends, then writes frames in order on that
// stream for the life of the group. Writes are queued and return at once.
class PeerLink {
 public:
  // Connects and handshakes, retrying while the peer's server is not up yet,
  // until the connect timeout; throws std::runtime_error with what went wrong.
  // `on_failure` runs (on a gRPC thread) if the stream later breaks.
  PeerLink(const std::string& target, const LinkIdentity& identity, const TransportConfig& config,
           std::function<void(const std::string&)> on_failure);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // False if the stream is broken or closing; the frame is dropped then.
  bool write(grpc::ByteBuffer frame);

  // Closing is split so that a group closes all its links at once: begin on
  // every link, then wait on each under one deadline, past which the stream is cut.
  void begin_close();
  void wait_closed(std::chrono::steady_clock::time_point deadline);

  class Stream;

 private:
  std::string description_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace tgpg
