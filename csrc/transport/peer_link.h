#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "transport/transport_config.h"

namespace tgpg {

struct LinkIdentity {
  std::string group_key;
  int src_rank;
  int dst_rank;
  int world_size;
};

// This rank's one stream to one peer: handshakes, then writes frames in order
// on a single long-lived Exchange stream. Writes are queued and return at once.
class PeerLink : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Connects and handshakes; throws std::runtime_error with what went wrong.
  // `on_failure` runs (on a gRPC thread) if the stream later breaks.
  PeerLink(const std::string& target, const LinkIdentity& identity, const TransportConfig& config,
           std::function<void(const std::string&)> on_failure);
  ~PeerLink() override;
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // False if the stream is already broken; the frame is dropped then.
  bool write(grpc::ByteBuffer frame);

  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void handshake(const LinkIdentity& identity, const TransportConfig& config);
  void close();

  std::string target_;
  std::string description_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  std::function<void(const std::string&)> on_failure_;

  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::deque<grpc::ByteBuffer> queue_;
  grpc::ByteBuffer in_flight_;
  bool writing_ = false;
  bool closing_ = false;
  bool writes_done_sent_ = false;
  bool done_ = false;
};

}  // namespace tgpg
