#include "transport/peer_link.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <stdexcept>

#include "torch_grpc_pg.grpc.pb.h"
#include "transport/channel_options.h"
#include "transport/protocol.h"

namespace tgpg {

PeerLink::PeerLink(const std::string& target, const LinkIdentity& identity, const TransportConfig& config,
                   std::function<void(const std::string&)> on_failure)
    : target_(target),
      description_("rank " + std::to_string(identity.src_rank) + " to rank " +
                   std::to_string(identity.dst_rank) + " at " + target),
      channel_(grpc::CreateCustomChannel(target, channel_credentials(config), channel_arguments(config))),
      on_failure_(std::move(on_failure)) {
  handshake(identity, config);
  context_.AddMetadata(kGroupKeyMetadata, identity.group_key);
  context_.AddMetadata(kSrcRankMetadata, std::to_string(identity.src_rank));
  context_.AddMetadata(kTokenMetadata, config.auth_token);
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel_);
  stub.PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
  StartCall();
}

void PeerLink::handshake(const LinkIdentity& identity, const TransportConfig& config) {
  torch_grpc_pg::HandshakeRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_group_key(identity.group_key);
  request.set_src_rank(static_cast<uint32_t>(identity.src_rank));
  request.set_dst_rank(static_cast<uint32_t>(identity.dst_rank));
  request.set_world_size(static_cast<uint32_t>(identity.world_size));
  request.set_auth_token(config.auth_token);
  torch_grpc_pg::HandshakeReply reply;
  auto stub = torch_grpc_pg::ProcessGroupService::NewStub(channel_);
  // The peer published its address only after its server was up, so the first
  // try usually succeeds. Retrying (rather than gRPC's wait_for_ready) keeps the
  // cause of the last failure, such as a TLS handshake error, for the message.
  const auto deadline = std::chrono::steady_clock::now() + config.connect_timeout;
  auto backoff = std::chrono::milliseconds(50);
  grpc::Status status;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::max(std::chrono::milliseconds(1), std::min<std::chrono::milliseconds>(
                         std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
                         std::chrono::seconds(10))));
    status = stub->Handshake(&ctx, request, &reply);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || std::chrono::steady_clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (!status.ok()) {
    throw std::runtime_error("could not connect " + description_ + ": " + status.error_message() +
                             " (gRPC status " + std::to_string(status.error_code()) +
                             "). Check that the peer is running, that the address is reachable from "
                             "here (set TORCH_GRPC_PG_ADVERTISE_HOST on the peer if not), that "
                             "firewalls let its port through, and that both sides use the same TLS settings.");
  }
  if (!reply.ok()) throw std::runtime_error("rank " + std::to_string(identity.dst_rank) +
                                            " refused the connection: " + reply.error());
}

bool PeerLink::write(grpc::ByteBuffer frame) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_ || closing_) return false;
    if (writing_) {
      queue_.push_back(std::move(frame));
      return true;
    }
    writing_ = true;
    in_flight_ = std::move(frame);
  }
  // Never under the mutex: gRPC may run OnWriteDone inline.
  StartWrite(&in_flight_);
  return true;
}

void PeerLink::OnWriteDone(bool ok) {
  bool send_writes_done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.Clear();
    if (!ok || queue_.empty()) {
      writing_ = false;
      // A failed write ends the stream; OnDone reports why. Dropping the queue
      // releases the payloads it holds.
      if (!ok) queue_.clear();
      send_writes_done = ok && closing_ && !writes_done_sent_;
      writes_done_sent_ = writes_done_sent_ || send_writes_done;
    } else {
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!writing_ && !send_writes_done) return;
  }
  if (send_writes_done) StartWritesDone();
  else StartWrite(&in_flight_);
}

void PeerLink::OnWritesDoneDone(bool /*ok*/) {}

void PeerLink::OnDone(const grpc::Status& status) {
  bool report = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();
    report = !closing_;
  }
  if (report && on_failure_) {
    on_failure_("the connection from " + description_ + " broke: " +
                (status.ok() ? std::string("the peer closed it") : status.error_message()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = true;
  done_cv_.notify_all();
}

void PeerLink::close() {
  bool send_writes_done = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    send_writes_done = !writing_ && !writes_done_sent_ && !done_;
    writes_done_sent_ = writes_done_sent_ || send_writes_done;
  }
  if (send_writes_done) StartWritesDone();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return done_; })) {
    // The peer does not drain its side; cut the stream rather than hang.
    context_.TryCancel();
    done_cv_.wait(lock, [&] { return done_; });
  }
}

PeerLink::~PeerLink() { close(); }

}  // namespace tgpg
