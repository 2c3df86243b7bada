#include "transport/exchange_reactor.h"

#include <unistd.h>

#include <string>

#include "transport/endpoint.h"
#include "transport/handshake.h"
#include "transport/log.h"
#include "transport/protocol.h"
#include "transport/status_reply.h"
#include "transport/wire_format.h"

namespace tgpg {

ExchangeReactor::ExchangeReactor(grpc::CallbackServerContext* ctx, RankServer& server)
    : ctx_(ctx), server_(server), gate_(std::make_shared<Gate>(this)) {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  try {
    admit();
  } catch (const std::exception& e) {
    // Out of memory or randomness, say: the stream never became a rank's.
    refuse(grpc::StatusCode::INTERNAL, std::string("this rank could not take the connection: ") + e.what());
  }
}

std::string ExchangeReactor::source() const {
  const std::string who = observer_ ? "an observer" : src_ >= 0 ? "rank " + std::to_string(src_) : "a caller";
  return who + " (" + ctx_->peer() + ")";
}

std::string ExchangeReactor::link_name() const {
  return "the link from rank " + std::to_string(src_) + " to rank " + std::to_string(group_->rank);
}

void ExchangeReactor::read_next() { StartRead(&read_buffer_); }

void ExchangeReactor::write(grpc::ByteBuffer message) {
  writes_.push_back(std::move(message));
  if (writes_.size() == 1) StartWrite(&writes_.front());
}

void ExchangeReactor::OnWriteDone(bool ok) {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  writes_.pop_front();
  if (!ok) writes_.clear();  // the stream broke; a failed read follows and ends it
  if (!writes_.empty()) {
    StartWrite(&writes_.front());
  } else if (finish_after_writes_) {
    const grpc::Status status = *finish_after_writes_;
    finish_after_writes_.reset();
    Finish(status);
  }
}

void ExchangeReactor::refuse_before_proof(const std::string& reason) {
  const std::string detail = "refused " + source() + ": " + reason;
  log_warning_limited(detail);
  // Without a token there is no proof to wait for, and nothing to hide: the
  // status tool shows the same to anyone who asks.
  const bool open_server = server_.config().auth_token.empty();
  refuse(grpc::StatusCode::PERMISSION_DENIED, open_server ? reason : kRefusedWithoutReason);
}

void ExchangeReactor::refuse(grpc::StatusCode code, const std::string& reason) {
  if (finishing_) return;
  finish(grpc::Status(code, reason));
}

void ExchangeReactor::finish(grpc::Status status) {
  if (finishing_) return;
  finishing_ = true;
  // Finish goes after the replies already queued, so that the caller reads them.
  if (writes_.empty()) Finish(std::move(status));
  else finish_after_writes_ = std::move(status);
}

void ExchangeReactor::admit() {
  const auto& metadata = ctx_->client_metadata();
  const auto found = metadata.find(kHelloMetadataKey);
  if (found == metadata.end()) {
    refuse_before_proof("its call carries no Hello; is it a torch-grpc-pg rank of the same release?");
    return;
  }
  ReceivedHello hello;
  try {
    hello = decode_hello(std::string(found->second.data(), found->second.size()));
  } catch (const std::exception& e) {
    refuse_before_proof(e.what());
    return;
  }
  const Transcript& claims = hello.transcript;
  observer_ = claims.src_rank == kObserverRank;
  if (!observer_ && claims.src_rank < static_cast<uint32_t>(INT32_MAX)) src_ = static_cast<int>(claims.src_rank);
  if (!proofs_match(caller_proof(server_.config().auth_token, claims), hello.proof)) {
    refuse_before_proof("authentication failed: it does not hold this rank's TORCH_GRPC_PG_AUTH_TOKEN, or runs "
                        "another torch-grpc-pg release; set the same token, and install the same release, on "
                        "every rank");
    return;
  }
  // The caller proved the token (or none is set): it may hear why it is refused.
  const std::string error = check_claims(claims);
  if (!error.empty()) {
    refuse(grpc::StatusCode::PERMISSION_DENIED, error);
    return;
  }
  welcome(claims);
}

std::string ExchangeReactor::check_claims(const Transcript& claims) {
  if (claims.protocol_version != kProtocolVersion) {
    return "protocol version " + std::to_string(claims.protocol_version) + " does not match this rank's version " +
           std::to_string(kProtocolVersion) + "; install the same torch-grpc-pg release on every rank";
  }
  if (claims.caller_nonce.size() != kNonceBytes) {
    return "the Hello's nonce has " + std::to_string(claims.caller_nonce.size()) + " bytes, not " +
           std::to_string(kNonceBytes);
  }
  try {
    peer_ = identify_call_peer(ctx_->peer());
  } catch (const std::exception& e) {
    return e.what();
  }
  if (claims.link != peer_->kind) {
    // Frames on the unix socket are not protected: a handshake meant for it
    // must not be carried here over TCP by a relay.
    return std::string("the caller dialled this rank's ") + link_kind_name(claims.link) + ", but the call came over " +
           link_kind_name(peer_->kind) + ": something between the two relays the connection";
  }
  if (observer_) {
    if (!claims.group_key.empty() || claims.dst_rank != 0 || claims.world_size != 0) {
      return "an observer's Hello names no group and no ranks";
    }
    return "";
  }
  const TransportConfig& config = server_.config();
  const Protection expected =
      link_protection(!config.auth_token.empty(), peer_->kind, config.tls_enabled(), config.encrypt);
  if (claims.protection != expected) {
    return "rank " + std::to_string(claims.src_rank) + " would send " + protection_name(claims.protection) +
           ", where rank " + std::to_string(claims.dst_rank) + " expects " + protection_name(expected) +
           " on this link; set TORCH_GRPC_PG_ENCRYPT and the TLS settings alike on every rank";
  }
  std::string error;
  group_ = server_.find_group(claims.group_key, static_cast<int>(claims.src_rank), static_cast<int>(claims.dst_rank),
                              static_cast<int>(claims.world_size), claims.settings, &error);
  if (!group_) return error;
  if (!server_.attach(*group_, src_, ctx_->peer(), &error)) {
    log_warning_limited("refused a second stream claiming to be rank " + std::to_string(src_) + " of group '" +
                        claims.group_key + "' from " + ctx_->peer() + ": " + error);
    return error;
  }
  return "";
}

void ExchangeReactor::welcome(const Transcript& claims) {
  const std::string& token = server_.config().auth_token;
  const std::string nonce = random_nonce();
  const LinkKeys keys = derive_link_keys(token, claims, nonce);
  if (!observer_ && claims.protection != Protection::None) {
    opener_ = std::make_unique<FrameOpener>(claims.protection, keys.caller_to_server,
                                            group_->max_payload_bytes + kMaxHeaderBytes + kFramingBytes);
  }
  ctx_->AddInitialMetadata(kWelcomeMetadataKey, encode_welcome(nonce, server_proof(token, claims, nonce)));
  StartSendInitialMetadata();
  if (observer_) {
    // An observer reads this process's state once and leaves; it joins no group.
    torch_grpc_pg::Frame status = status_frame(server_.snapshot());
    if (!token.empty()) status.set_status_mac(hmac_sha256(keys.server_to_caller, status.status().SerializeAsString()));
    grpc::Slice bytes(status.SerializeAsString());
    write(grpc::ByteBuffer(&bytes, 1));
    finish(grpc::Status::OK);
    return;
  }
  open_ = true;
  read_next();
}

void ExchangeReactor::OnReadDone(bool ok) {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (finishing_) return;
  if (!ok) {
    // Only an admitted stream speaks for its rank: a stranger's closing
    // stream must not fail anybody's group.
    if (open_) {
      const std::string reason = "rank " + std::to_string(src_) + " closed its connection to rank " +
                                 std::to_string(group_->rank) +
                                 " (it exited, crashed, or destroyed the process group)";
      if (ring_reader_) {
        // The frames it appended to its ring before the end are still to be
        // delivered; the reader closes the source and finishes the stream after.
        ring_reader_->end(reason);
        return;
      }
      group_->mailbox->close_source(src_, reason);
    }
    finish(grpc::Status::OK);
    return;
  }
  try {
    on_frame();
  } catch (const std::exception& e) {
    fail_stream("rank " + std::to_string(group_->rank) + " could not take a frame from rank " + std::to_string(src_) +
                ": " + e.what());
  }
}

void ExchangeReactor::fail_stream(const std::string& reason) {
  group_->mailbox->fail(reason);
  refuse(grpc::StatusCode::INVALID_ARGUMENT, reason);
}

void ExchangeReactor::on_frame() {
  grpc::ByteBuffer received = std::move(read_buffer_);
  read_buffer_.Clear();
  if (opener_) {
    try {
      received = opener_->open(std::move(received));
    } catch (const FrameAuthenticationError& e) {
      fail_stream(link_name() + " failed authentication at " + e.what() +
                  ": a message was altered, dropped, replayed or reordered between the two ranks, so something on "
                  "the way tampers with their traffic (or the ranks derived different keys: are both of the same "
                  "torch-grpc-pg release?)");
      return;
    } catch (const std::exception& e) {
      fail_stream("rank " + std::to_string(src_) + " sent an unreadable message (" + e.what() +
                  "); are both ranks running the same torch-grpc-pg release?");
      return;
    }
  }
  DecodedMessage message;
  try {
    message = decode_message(std::move(received), group_->max_payload_bytes);
  } catch (const std::exception& e) {
    fail_stream("rank " + std::to_string(src_) + " sent an unreadable frame (" + e.what() +
                "); are both ranks running the same torch-grpc-pg release and chunk_bytes?");
    return;
  }
  if (message.ring_offer) {
    on_ring_offer(*message.ring_offer);
    return;
  }
  if (message.ring_switch) {
    on_ring_switch();
    return;
  }
  ReceivedFrame& frame = message.frame;
  if (ring_reader_ && frame.header.kind != FrameKind::Abort) {
    fail_stream("rank " + std::to_string(src_) +
                " sent a data frame on its stream after switching to its shared ring, where it would overtake "
                "the frames before it; are both ranks running the same torch-grpc-pg release?");
    return;
  }
  if (message.ring_slot) {
    // A sender names slots only in the ring's records, after the switch; on the
    // stream a slot would let a frame read the ring out of the records' order.
    fail_stream("rank " + std::to_string(src_) +
                " named a slot of its shared ring on its stream, where only the ring's records may name one; are "
                "both ranks running the same torch-grpc-pg release?");
    return;
  }
  // The stream, not the header, says who sent the frame.
  frame.header.src_rank = static_cast<uint32_t>(src_);
  if (frame.header.kind == FrameKind::Abort) {
    group_->mailbox->fail("rank " + std::to_string(src_) + " failed: " + frame.header.error);
    read_next();
    return;
  }
  if (group_->mailbox->deliver(src_, std::move(frame), gate_)) read_next();
}

void ExchangeReactor::on_ring_offer(const RingOffer& offer) {
  if (ring_offered_) {
    fail_stream("rank " + std::to_string(src_) + " offered a second shared ring on one stream");
    return;
  }
  ring_offered_ = true;
  // Declining costs nothing: the caller finds the ring unmapped and keeps
  // sending inline.
  if (!server_.config().shared_memory) {
    read_next();
    return;
  }
  std::string declined;
  if (peer_->kind != LinkKind::Unix || !peer_->process) {
    // Only a caller that reached this rank's unix socket, which only this
    // host's processes of this user can, may name a file of this host for it
    // to open.
    declined = "it came over " + ctx_->peer() + ", not the rank's unix socket";
  } else if (offer.pid != static_cast<uint32_t>(peer_->process->pid)) {
    // A file of another process: the caller may not choose which ring this
    // rank reads, only offer its own.
    declined = "it names process " + std::to_string(offer.pid) + ", but process " +
               std::to_string(peer_->process->pid) + " is at the other end of the socket";
  } else if (offer.pid == static_cast<uint32_t>(::getpid())) {
    declined = "it names a file of this very process";
  } else {
    try {
      ring_ = ReceiveRing::attach(offer, group_->max_payload_bytes);
    } catch (const std::exception& e) {
      declined = e.what();
    }
  }
  if (!declined.empty()) {
    log_warning("rank " + std::to_string(group_->rank) + " did not map the shared-memory ring that " + source() +
                " offered (" + declined + "); that peer's chunks come through the socket instead.");
  }
  read_next();
}

void ExchangeReactor::on_ring_switch() {
  if (!ring_ || ring_reader_) {
    fail_stream("rank " + std::to_string(src_) + (ring_ ? " switched to its shared ring twice" :
                " switched to a shared ring that this rank did not map") +
                "; are both ranks running the same torch-grpc-pg release?");
    return;
  }
  std::shared_ptr<Gate> gate = gate_;
  try {
    ring_reader_ = std::make_unique<RingReader>(
        ring_, group_->mailbox, src_, group_->max_payload_bytes,
        RingReader::Events{[gate] { gate->finish_drained(); },
                           [gate](const std::string& reason) { gate->refuse_from_ring(reason); }});
  } catch (const std::exception& e) {
    // No thread to spare (a container's pids limit, say): the frames that
    // follow are in the ring, and nobody would read them.
    fail_stream("rank " + std::to_string(group_->rank) + " could not start the thread that reads rank " +
                std::to_string(src_) + "'s shared ring (" + e.what() +
                "); raise the process's thread limit, or set TORCH_GRPC_PG_SHARED_MEMORY=0");
    return;
  }
  // The stream still carries aborts, and its end.
  read_next();
}

void ExchangeReactor::OnCancel() {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (ring_reader_) ring_reader_->stop();
  if (open_) {
    group_->mailbox->close_source(src_, "the connection from rank " + std::to_string(src_) + " to rank " +
                                            std::to_string(group_->rank) + " broke (rank " +
                                            std::to_string(src_) + " may have crashed)");
  }
  finish(grpc::Status::CANCELLED);
}

void ExchangeReactor::OnDone() {
  gate_->detach();
  // No reaction runs after OnDone, and the detached gate turns the reader's
  // events into nothing, so the reader is this thread's alone to stop and
  // join, outside the gate's mutex, which its events take.
  ring_reader_.reset();
  delete this;  // the callback API's ownership rule for server reactors
}

void ExchangeReactor::Gate::resume() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ != nullptr && reactor_->open_ && !reactor_->finishing_) reactor_->read_next();
}

void ExchangeReactor::Gate::finish_drained() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ != nullptr) reactor_->finish(grpc::Status::OK);
}

void ExchangeReactor::Gate::refuse_from_ring(const std::string& reason) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ != nullptr) reactor_->refuse(grpc::StatusCode::INVALID_ARGUMENT, reason);
}

void ExchangeReactor::Gate::detach() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  reactor_ = nullptr;
}

}  // namespace tgpg
