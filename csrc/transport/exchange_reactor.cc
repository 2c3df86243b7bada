#include "transport/exchange_reactor.h"

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
  if (!server_.begin_handshake(gate_)) {
    refuse(grpc::StatusCode::RESOURCE_EXHAUSTED,
           "too many connections are handshaking with this rank at once; try again");
    return;
  }
  in_handshake_ = true;
  read_next();
}

std::string ExchangeReactor::source() const {
  const std::string who = observer_ ? "an observer" : src_ >= 0 ? "rank " + std::to_string(src_) : "a caller";
  return who + " (" + ctx_->peer() + ")";
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

void ExchangeReactor::refuse(grpc::StatusCode code, const std::string& reason, grpc::ByteBuffer reply) {
  if (finishing_) return;
  if (reply.Length() > 0) write(std::move(reply));
  finish(grpc::Status(code, reason));
}

void ExchangeReactor::finish(grpc::Status status) {
  leave_handshake();
  if (finishing_) return;
  finishing_ = true;
  // Finish goes after the replies already queued, so that the caller reads why.
  if (writes_.empty()) Finish(std::move(status));
  else finish_after_writes_ = std::move(status);
}

void ExchangeReactor::leave_handshake() {
  if (!in_handshake_) return;
  in_handshake_ = false;
  server_.end_handshake(gate_.get());
}

void ExchangeReactor::OnReadDone(bool ok) {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (finishing_) return;
  if (!ok) {
    // Only an authenticated stream speaks for its rank: a stranger's closing
    // stream must not fail anybody's group.
    if (state_ == State::Open) {
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
  switch (state_) {
    case State::AwaitHello: on_hello(); break;
    case State::AwaitProof: on_proof(); break;
    case State::Open: on_frame(); break;
  }
}

void ExchangeReactor::on_hello() {
  torch_grpc_pg::Frame hello_message;
  try {
    hello_message = decode_handshake(read_buffer_, HandshakeStep::Hello);
  } catch (const std::exception& e) {
    refuse(grpc::StatusCode::INVALID_ARGUMENT, e.what());
    return;
  }
  read_buffer_.Clear();
  const auto& hello = hello_message.hello();
  std::string error;
  observer_ = hello.src_rank() == kObserverRank;
  if (hello.protocol_version() != kProtocolVersion) {
    error = "protocol version " + std::to_string(hello.protocol_version()) + " does not match this rank's version " +
            std::to_string(kProtocolVersion) + "; install the same torch-grpc-pg release on every rank";
  } else if (hello.nonce().size() != kNonceBytes) {
    error = "the Hello's nonce has " + std::to_string(hello.nonce().size()) + " bytes, not " +
            std::to_string(kNonceBytes);
  } else if (observer_) {
    if (!hello.group_key().empty() || hello.dst_rank() != 0 || hello.world_size() != 0) {
      error = "an observer's Hello names no group and no ranks";
    }
  } else {
    group_ = server_.find_group(hello.group_key(), static_cast<int>(hello.src_rank()),
                                static_cast<int>(hello.dst_rank()), static_cast<int>(hello.world_size()),
                                hello.settings(), &error);
  }
  torch_grpc_pg::Frame reply;
  auto* challenge = reply.mutable_challenge();
  if (!error.empty()) {
    challenge->set_error(error);
    refuse(grpc::StatusCode::PERMISSION_DENIED, error, encode_handshake(reply));
    return;
  }
  src_ = static_cast<int>(hello.src_rank());
  transcript_ = Transcript{hello.group_key(), hello.src_rank(), hello.dst_rank(), hello.world_size(),
                           hello.nonce(), random_nonce()};
  challenge->set_nonce(transcript_.server_nonce);
  challenge->set_proof(make_proof(server_.config().auth_token, ProofRole::Server, transcript_));
  state_ = State::AwaitProof;
  write(encode_handshake(reply));
  read_next();
}

void ExchangeReactor::on_proof() {
  torch_grpc_pg::Frame proof_message;
  try {
    proof_message = decode_handshake(read_buffer_, HandshakeStep::Proof);
  } catch (const std::exception& e) {
    refuse(grpc::StatusCode::INVALID_ARGUMENT, e.what());
    return;
  }
  read_buffer_.Clear();
  std::string error;
  if (!check_proof(server_.config().auth_token, ProofRole::Caller, transcript_, proof_message.proof().proof())) {
    error = "authentication failed: " + source() +
            " does not hold this rank's TORCH_GRPC_PG_AUTH_TOKEN; set the same token on every rank";
  } else if (observer_) {
    // An observer reads this process's state once and leaves; it joins no group.
    torch_grpc_pg::Frame welcome;
    welcome.mutable_welcome();
    write(encode_handshake(welcome));
    grpc::Slice status(status_frame(server_.snapshot()).SerializeAsString());
    write(grpc::ByteBuffer(&status, 1));
    finish(grpc::Status::OK);
    return;
  } else if (!server_.attach(*group_, src_, ctx_->peer(), &error)) {
    log_warning("refused a second stream claiming to be rank " + std::to_string(src_) + " of group '" +
                transcript_.group_key + "' from " + ctx_->peer() + ": " + error);
  } else {
    attached_ = true;
  }
  torch_grpc_pg::Frame reply;
  reply.mutable_welcome()->set_error(error);
  if (!error.empty()) {
    refuse(grpc::StatusCode::PERMISSION_DENIED, error, encode_handshake(reply));
    return;
  }
  leave_handshake();
  state_ = State::Open;
  write(encode_handshake(reply));
  read_next();
}

void ExchangeReactor::fail_stream(const std::string& reason) {
  group_->mailbox->fail(reason);
  refuse(grpc::StatusCode::INVALID_ARGUMENT, reason);
}

void ExchangeReactor::on_frame() {
  DecodedMessage message;
  try {
    message = decode_message(std::move(read_buffer_), group_->max_payload_bytes);
  } catch (const std::exception& e) {
    fail_stream("rank " + std::to_string(src_) + " sent an unreadable frame (" + e.what() +
                "); are both ranks running the same torch-grpc-pg release and chunk_bytes?");
    return;
  }
  read_buffer_.Clear();
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
  if (!is_unix_address(ctx_->peer())) {
    // Only a caller that reached this rank's unix socket, which only this
    // host's processes with access to the socket's directory can, may name a
    // file of this host for it to open.
    declined = "it came over " + ctx_->peer() + ", not a unix socket";
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
  ring_reader_ = std::make_unique<RingReader>(
      ring_, group_->mailbox, src_, group_->max_payload_bytes,
      RingReader::Events{[gate] { gate->finish_drained(); },
                         [gate](const std::string& reason) { gate->refuse_from_ring(reason); }});
  // The stream still carries aborts, and its end.
  read_next();
}

void ExchangeReactor::OnCancel() {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (ring_reader_) ring_reader_->stop();
  if (state_ == State::Open) {
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
  {
    std::lock_guard<std::recursive_mutex> lock(gate_->mutex());
    leave_handshake();
    if (attached_) server_.detach(*group_, src_);
  }
  delete this;  // the callback API's ownership rule for server reactors
}

void ExchangeReactor::Gate::resume() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ != nullptr && reactor_->state_ == State::Open && !reactor_->finishing_) reactor_->read_next();
}

void ExchangeReactor::Gate::cancel() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ != nullptr) reactor_->ctx_->TryCancel();
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
