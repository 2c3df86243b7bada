#include "transport/peer_link.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "transport/auth.h"
#include "transport/frame_protection.h"
#include "transport/channel_options.h"
#include "transport/endpoint.h"
#include "transport/handshake.h"
#include "transport/log.h"
#include "transport/protocol.h"
#include "transport/unix_channel.h"
#include "transport/wire_format.h"

namespace tgpg {
namespace {

using Clock = std::chrono::steady_clock;

// How long past the close deadline a cut call may take to end, and at least
// how long after its cut, before its link is left open.
constexpr std::chrono::milliseconds kCutGrace{1000};
constexpr std::chrono::milliseconds kCutLeast{100};

}  // namespace

// One Exchange RPC. A reactor serves one call only, so a retried connection
// attempt is a new Stream on the same channel.
class PeerLink::Stream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>, public FrameStream {
 public:
  struct Outcome {
    bool ok = false;
    bool retryable = false;  // the peer's server was not reachable (yet)
    std::string error;
  };

  // Starts the call, its Hello in the metadata (see Hello in protos/torch_grpc_pg.proto).
  Stream(const std::shared_ptr<grpc::Channel>& channel, const Transcript& transcript, const std::string& token,
         std::string description, std::function<void(const std::string&)> on_failure)
      : transcript_(transcript), token_(token), description_(std::move(description)),
        on_failure_(std::move(on_failure)) {
    context_.AddMetadata(kHelloMetadataKey, encode_hello(transcript_, caller_proof(token_, transcript_)));
    grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
    stub.PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
    // The server writes nothing after its Welcome; this read ends when the
    // call does, which is how a link with nothing to write learns of its end.
    StartRead(&read_buffer_);
    // Frames are written from the group's threads, outside any reaction. The
    // hold keeps gRPC from finishing the call (and freeing its state) between
    // such a thread's check that the stream is open and its StartWrite; it is
    // removed once no more writes can start (see take_hold).
    AddHold();
    StartCall();
  }

  // Waits for the handshake's end. At the deadline the call is cut.
  Outcome wait_handshake(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_until(lock, deadline, [&] { return phase_ == Phase::Open || phase_ == Phase::Failed || done_; })) {
      lock.unlock();
      fail_handshake("timed out during the handshake", /*retryable=*/true);
      lock.lock();
    }
    if (phase_ == Phase::Open) return {true, false, ""};
    // A failed handshake ends the call; its OnDone must run before the reactor goes.
    cv_.wait(lock, [&] { return done_; });
    return outcome_;
  }

  // The link's keys, once the handshake is over.
  const LinkKeys& keys() const { return keys_; }

  bool write(grpc::ByteBuffer message) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_ || closing_ || writes_ended_) return false;
      if (writing_) {
        queue_.push_back(std::move(message));
        return true;
      }
      writing_ = true;
      in_flight_ = std::move(message);
    }
    // Never under the mutex: gRPC may run OnWriteDone inline.
    StartWrite(&in_flight_);
    return true;
  }

  bool ended() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ || writes_ended_;
  }

  void notify_end(std::function<void()> on_end) override {
    std::lock_guard<std::mutex> lock(mutex_);
    on_end_ = std::move(on_end);
    if (done_ || writes_ended_) announce_end();
  }

  void begin_close() override {
    bool send_writes_done = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
      send_writes_done = !writing_ && !writes_ended_ && take_hold();
    }
    if (send_writes_done) finish_writes();
  }

  // Waits for the call's end until `deadline`, then cuts it and waits up to
  // kCutGrace more. False if even the cut call has not ended: gRPC completes a
  // cancelled call's writes only once the socket write in progress finishes,
  // which a peer that is alive but reads nothing (stopped, hung) never lets
  // happen. A later call does not wait again.
  bool wait_closed(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_until(lock, deadline, [&] { return done_; })) return true;
    if (cut_) return false;
    cut_ = true;
    lock.unlock();
    context_.TryCancel();  // may finish the call inline, which takes mutex_
    lock.lock();
    // Links closed together share the deadline; one cut late still gets kCutLeast.
    const auto cut_deadline = std::max(deadline + kCutGrace, Clock::now() + kCutLeast);
    return cv_.wait_until(lock, cut_deadline, [&] { return done_; });
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  void OnReadInitialMetadataDone(bool ok) override {
    // Without metadata the call has ended; OnDone tells why (a refusal).
    if (!ok) return;
    try {
      on_welcome();
    } catch (const std::exception& e) {
      fail_handshake(std::string("the peer's Welcome is malformed: ") + e.what(), false);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      end_writes();  // the server ended the call; OnDone says why
      return;
    }
    // The server sends nothing after its Welcome: dropped.
    read_buffer_.Clear();
    StartRead(&read_buffer_);
  }

  void OnWriteDone(bool ok) override {
    bool send_writes_done = false;
    bool remove_hold = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.Clear();
      // A failed write ends the stream; OnDone reports why.
      if (!ok) end_writes_locked();
      if (writes_ended_ || queue_.empty()) {
        writing_ = false;
        if (writes_ended_) {
          queue_.clear();  // releases the payloads it holds
          remove_hold = take_hold();
        } else {
          send_writes_done = closing_ && take_hold();
        }
      } else {
        in_flight_ = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!writing_ && !send_writes_done && !remove_hold) return;
    }
    if (send_writes_done) finish_writes();
    else if (remove_hold) RemoveHold();
    else StartWrite(&in_flight_);
  }

  void OnDone(const grpc::Status& status) override {
    bool report = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.clear();
      if (phase_ != Phase::Open && phase_ != Phase::Failed) {
        phase_ = Phase::Failed;
        const int dst = static_cast<int>(transcript_.dst_rank);
        if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
            status.error_message() == kRefusedWithoutReason) {
          outcome_ = {false, false,
                      "authentication failed: rank " + std::to_string(dst) +
                          " refused the connection without saying why, as a rank that holds a token does to a "
                          "caller that has not proved it: the ranks hold different TORCH_GRPC_PG_AUTH_TOKENs (set "
                          "the same one on every rank), or run different torch-grpc-pg releases. Rank " +
                          std::to_string(dst) + "'s log says which."};
        } else if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          outcome_ = {false, false, "rank " + std::to_string(dst) + " refused the connection: " +
                                        status.error_message()};
        } else {
          outcome_ = {false, status.error_code() == grpc::StatusCode::UNAVAILABLE,
                      status.error_message() + " (gRPC status " + std::to_string(status.error_code()) + ")"};
        }
      }
      report = phase_ == Phase::Open && !closing_;
    }
    if (report && on_failure_) {
      try {
        on_failure_("the connection from " + description_ + " broke: " +
                    (status.ok() ? std::string("the peer closed it") : status.error_message()));
      } catch (const std::exception& e) {
        // No exception may leave a gRPC callback; the group's own waits still end at its timeout.
        log_warning("could not report that the connection from " + description_ + " broke: " + e.what());
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    announce_end();
    cv_.notify_all();
  }

 private:
  enum class Phase { AwaitWelcome, Open, Failed };

  void on_welcome() {
    const auto& metadata = context_.GetServerInitialMetadata();
    const auto found = metadata.find(kWelcomeMetadataKey);
    // No Welcome: the server refused, and the call's status says why.
    if (found == metadata.end()) return;
    const torch_grpc_pg::Welcome welcome = decode_welcome(std::string(found->second.data(), found->second.size()));
    const int dst = static_cast<int>(transcript_.dst_rank);
    // The caller proved itself in its Hello; the server proves itself here,
    // before this rank writes a frame. Both proofs, and the keys, bind every
    // field of the Hello and both nonces.
    if (welcome.nonce().size() != kNonceBytes ||
        !proofs_match(server_proof(token_, transcript_, welcome.nonce()), welcome.proof())) {
      fail_handshake("authentication failed: rank " + std::to_string(dst) +
                         " could not prove that it holds this rank's TORCH_GRPC_PG_AUTH_TOKEN. Either the ranks "
                         "hold different tokens (set the same one on every rank), or the address published "
                         "in the store is not rank " + std::to_string(dst) + "'s.",
                     false);
      return;
    }
    keys_ = derive_link_keys(token_, transcript_, welcome.nonce());
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ != Phase::AwaitWelcome) return;
    phase_ = Phase::Open;
    cv_.notify_all();
  }

  // Whoever takes the hold removes it: once, and only when no write can start
  // any more. The caller holds mutex_.
  bool take_hold() {
    if (hold_taken_) return false;
    hold_taken_ = true;
    return true;
  }

  void finish_writes() {
    StartWritesDone();
    RemoveHold();
  }

  // The call is ending: no write starts from now on, and the hold goes as soon
  // as none is in flight (else the write's completion removes it).
  void end_writes() {
    bool remove_hold = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      end_writes_locked();
      remove_hold = !writing_ && take_hold();
    }
    if (remove_hold) RemoveHold();
  }

  void end_writes_locked() {
    writes_ended_ = true;
    announce_end();
  }

  // The caller holds mutex_, and the stream has ended.
  void announce_end() {
    if (on_end_) std::exchange(on_end_, nullptr)();
  }

  void fail_handshake(const std::string& error, bool retryable) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (phase_ == Phase::Open || phase_ == Phase::Failed) return;
      phase_ = Phase::Failed;
      outcome_ = {false, retryable, error};
      cv_.notify_all();
    }
    context_.TryCancel();
    end_writes();
  }

  Transcript transcript_;
  std::string token_;
  std::string description_;
  std::function<void(const std::string&)> on_failure_;
  grpc::ClientContext context_;
  grpc::ByteBuffer read_buffer_;
  LinkKeys keys_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  Phase phase_ = Phase::AwaitWelcome;
  Outcome outcome_;
  std::deque<grpc::ByteBuffer> queue_;
  grpc::ByteBuffer in_flight_;
  bool writing_ = false;
  bool closing_ = false;
  bool writes_ended_ = false;  // the call is ending: no write may start
  bool hold_taken_ = false;    // someone has removed, or is about to remove, the hold
  bool cut_ = false;           // wait_closed has cancelled the call
  bool done_ = false;
  std::function<void()> on_end_;  // see FrameStream::notify_end
};

PeerLink::PeerLink(const std::string& target, const LinkIdentity& identity, const TransportConfig& config,
                   std::function<void(const std::string&)> on_failure, RingWriter::SentCounter count_sent)
    : description_("rank " + std::to_string(identity.src_rank) + " to rank " + std::to_string(identity.dst_rank) +
                   " at " + target),
      count_sent_(std::move(count_sent)),
      ring_slots_(static_cast<uint32_t>(std::clamp<size_t>(config.max_queued_frames, 1, kRingSlots))),
      ring_slot_bytes_(config.max_payload_bytes) {
  const LinkKind kind = is_unix_address(target) ? LinkKind::Unix : LinkKind::Tcp;
  const Protection protection =
      link_protection(!config.auth_token.empty(), kind, config.tls_enabled(), config.encrypt);
  // A ring's records are not protected: rings only ever join unprotected
  // links, which are this host's unix sockets.
  ring_possible_ = config.shared_memory && kind == LinkKind::Unix && protection == Protection::None;
  const grpc::ChannelArguments args = channel_arguments(config);
  // A channel over a socket of our own cannot reconnect: each try gets a new one.
  const bool own_socket = kind == LinkKind::Unix;
  std::shared_ptr<grpc::Channel> shared;
  if (!own_socket) shared = grpc::CreateCustomChannel(target, channel_credentials(config), args);
  // The peer published its address only after its server was up, so the first
  // try usually succeeds. Retrying (rather than gRPC's wait_for_ready) keeps
  // the cause of the last failure, such as a TLS error, for the message.
  const auto deadline = Clock::now() + config.connect_timeout;
  auto backoff = std::chrono::milliseconds(50);
  for (;;) {
    std::shared_ptr<grpc::Channel> channel = shared;
    Stream::Outcome outcome;
    std::optional<PeerProcess> peer;
    if (own_socket) channel = dial_unix_socket(target, config, args, &outcome.error, &peer);
    if (channel) {
      // A fresh nonce per try: each call is a handshake of its own.
      const Transcript transcript{kProtocolVersion,
                                  identity.group_key,
                                  static_cast<uint32_t>(identity.src_rank),
                                  static_cast<uint32_t>(identity.dst_rank),
                                  static_cast<uint32_t>(identity.world_size),
                                  config.shared_settings(),
                                  kind,
                                  protection,
                                  random_nonce()};
      auto stream = std::make_unique<Stream>(channel, transcript, config.auth_token, description_, on_failure);
      outcome = stream->wait_handshake(deadline);
      if (outcome.ok) {
        if (protection != Protection::None) {
          sealer_ = std::make_unique<FrameSealer>(protection, stream->keys().caller_to_server);
        }
        channel_ = std::move(channel);
        stream_ = std::move(stream);
        if (peer) peer_pid_ = static_cast<uint32_t>(peer->pid);
        return;
      }
      if (!outcome.retryable) throw std::runtime_error(outcome.error);
    }
    if (Clock::now() + backoff >= deadline) {
      throw std::runtime_error("could not connect " + description_ + ": " + outcome.error +
                               ". Check that the peer is running, that the address is reachable from here (set "
                               "TORCH_GRPC_PG_ADVERTISE_HOST on the peer if not), that firewalls let its port "
                               "through, and that both sides use the same TLS settings.");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

bool PeerLink::send(const FrameHeader& header, ByteView payload, std::function<void()> release) {
  if (RingWriter* writer = ring_writer(header)) return writer->send(header, payload, std::move(release));
  count_sent_(payload.size, /*through_ring=*/false);
  if (!sealer_) return stream_->write(encode_frame(header, payload, std::move(release)));
  // Numbered in the order they are queued: the receiver opens them in that order.
  std::lock_guard<std::mutex> lock(seal_mutex_);
  return stream_->write(sealer_->seal(encode_frame_prefix(header, payload.size), payload, std::move(release)));
}

RingWriter* PeerLink::ring_writer(const FrameHeader& header) {
  std::lock_guard<std::mutex> lock(ring_mutex_);
  // Offered with the first frame of any size: small frames gain the most from
  // the records (a 4-byte allreduce takes half the time it takes on the
  // stream), and slots' pages are allocated only when first used. A failed
  // group needs no ring for its abort.
  if (ring_writer_ || !ring_possible_ || header.kind == FrameKind::Abort) return ring_writer_.get();
  ring_possible_ = false;  // one try per link
  // The writer (and its thread) first: a link that cannot have one offers no
  // ring, and goes on through the socket.
  std::unique_ptr<RingWriter> writer;
  RingOffer offer;
  try {
    auto ring = std::make_unique<SendRing>(ring_slots_, ring_slot_bytes_);
    offer = ring->offer();
    writer = std::make_unique<RingWriter>(std::move(ring), *stream_, count_sent_);
  } catch (const std::exception& e) {
    log_warning("could not make a shared-memory ring for " + description_ + " (" + e.what() +
                "); chunks to that peer go through the socket, which is slower. Set "
                "TORCH_GRPC_PG_SHARED_MEMORY=0 to stop trying.");
    return nullptr;
  }
  // The peer maps the ring when it reads this; until then the writer finds it
  // unmapped and sends payloads inline.
  if (!stream_->write(encode_ring_offer(offer))) return nullptr;
  ring_writer_ = std::move(writer);
  return ring_writer_.get();
}

void PeerLink::begin_close() {
  RingWriter* writer = nullptr;
  {
    std::lock_guard<std::mutex> lock(ring_mutex_);
    ring_possible_ = false;
    writer = ring_writer_.get();
  }
  // The writer closes the stream once it has written what it holds.
  if (writer) writer->begin_close();
  else stream_->begin_close();
}

void PeerLink::wait_closed(std::chrono::steady_clock::time_point deadline) {
  RingWriter* writer = nullptr;
  {
    std::lock_guard<std::mutex> lock(ring_mutex_);
    writer = ring_writer_.get();
  }
  if (writer) writer->wait_closed(deadline);
  if (!stream_->wait_closed(deadline) && !left_open_) {
    left_open_ = true;
    log_warning("the link from " + description_ + " did not close: the peer neither takes what this rank sent "
                "nor closes its end (it may be stopped or hung). The link stays open, holding what it had "
                "queued, until the peer reads again or exits.");
  }
}

PeerLink::~PeerLink() {
  begin_close();
  wait_closed(Clock::now() + std::chrono::seconds(2));
  if (stream_->closed()) return;
  // gRPC will still call the stream when the peer reads or goes, so it must
  // outlive the link: it is left to run, and never freed. Its ring writer,
  // whose thread and end hook use it, goes first, as the member order has it.
  ring_writer_.reset();
  static_cast<void>(stream_.release());
}

}  // namespace tgpg
