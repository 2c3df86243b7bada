#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "algorithms/frame.h"
#include "transport/shared_ring.h"
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

  // To a peer on this host: copies `payload` into this link's shared ring and
  // says where, for a frame written next by encode_ring_frame. Nothing when the
  // payload is small, the link crosses hosts, the peer has not mapped the ring
  // (it is offered on the first call) or holds all its slots: the payload then
  // goes inline.
  std::optional<RingSlot> put_in_ring(ByteView payload);

  // Closing is split so that a group closes all its links at once: begin on
  // every link, then wait on each under one deadline, past which the stream is cut.
  void begin_close();
  void wait_closed(std::chrono::steady_clock::time_point deadline);

  class Stream;

 private:
  std::string description_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stream> stream_;
  std::mutex ring_mutex_;
  bool ring_possible_;
  uint32_t ring_slots_;
  uint64_t ring_slot_bytes_;
  std::unique_ptr<SendRing> ring_;
};

}  // namespace tgpg
