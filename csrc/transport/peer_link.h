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
#include "transport/frame_protection.h"
#include "transport/ring_writer.h"
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
// stream for the life of the group, each protected with the link's keys where
// it has them (a token, over TCP). Writes are queued and return at once.
class PeerLink {
 public:
  // Connects and handshakes, retrying while the peer's server is not up yet,
  // until the connect timeout; throws std::runtime_error with what went wrong.
  // `on_failure` runs (on a gRPC thread) if the stream later breaks;
  // `count_sent` for every payload as it goes out.
  PeerLink(const std::string& target, const LinkIdentity& identity, const TransportConfig& config,
           std::function<void(const std::string&)> on_failure, RingWriter::SentCounter count_sent);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Queues a frame; frames reach the peer in the order they were sent. The
  // payload is not copied here: `release` runs once it may change again. To a
  // peer on this host, the first data frame offers a shared ring, and from
  // then on a RingWriter sends frames through it. False if the stream is
  // broken or closing; the frame is dropped then.
  bool send(const FrameHeader& header, ByteView payload, std::function<void()> release);

  // The process at the other end of a link over this host's unix socket, as
  // the kernel tells it; nothing for a TCP link.
  std::optional<uint32_t> peer_pid() const { return peer_pid_; }

  // Closing is split so that a group closes all its links at once: begin on
  // every link, then wait on each under one deadline, past which the stream is
  // cut. A stream that does not end even then (its peer is alive but reads
  // nothing, so gRPC's socket write never finishes) is left open, with a
  // warning, rather than hang the caller: the destructor leaves it to gRPC.
  void begin_close();
  void wait_closed(std::chrono::steady_clock::time_point deadline);

  class Stream;

 private:
  // The link's RingWriter, made (with the ring, which is offered then) by the
  // first data frame; null while frames go straight to the stream.
  RingWriter* ring_writer(const FrameHeader& header);

  std::string description_;
  std::optional<uint32_t> peer_pid_;
  RingWriter::SentCounter count_sent_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<FrameSealer> sealer_;  // on a link whose handshake gave it keys
  std::mutex seal_mutex_;
  std::mutex ring_mutex_;
  bool ring_possible_;
  uint32_t ring_slots_;
  uint64_t ring_slot_bytes_;
  bool left_open_ = false;  // the stream did not end when cut (see wait_closed)
  // After stream_, so that it goes first: its thread writes to the stream.
  std::unique_ptr<RingWriter> ring_writer_;
};

}  // namespace tgpg
