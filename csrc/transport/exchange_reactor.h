#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "transport/auth.h"
#include "transport/mailbox.h"
#include "transport/rank_server.h"
#include "transport/ring_reader.h"
#include "transport/shared_ring.h"

namespace tgpg {

// Server side of one Exchange stream. It runs the handshake (Hello, Challenge,
// Proof, Welcome) before it believes anything the caller says, then binds the
// stream to the (group, source rank) it authenticated as and hands its frames
// to that group's mailbox, pausing while the mailbox's queue for that peer is
// full. Nothing a caller sends before the Welcome reaches a group. Once the
// caller switches to the shared ring it offered, a RingReader delivers its
// data frames instead, and the stream carries only aborts and the end.
class ExchangeReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ExchangeReactor(grpc::CallbackServerContext* ctx, RankServer& server);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // gRPC may run a reaction inline, inside the Start* or Finish call that
  // caused it, and OnDone deletes the reactor. The gate therefore lives apart
  // from the reactor, and its mutex is recursive. The mailbox resumes reading
  // through it, and the server cuts a stalled handshake through it.
  class Gate : public ReadGate, public Cancellable {
   public:
    explicit Gate(ExchangeReactor* reactor) : reactor_(reactor) {}
    void resume() override;
    void cancel() override;
    // From the ring reader's thread: it delivered everything, or refused a record.
    void finish_drained();
    void refuse_from_ring(const std::string& reason);
    void detach();
    std::recursive_mutex& mutex() { return mutex_; }

   private:
    std::recursive_mutex mutex_;
    ExchangeReactor* reactor_;
  };

  enum class State { AwaitHello, AwaitProof, Open };

  // All below run with the gate mutex held.
  void on_hello();
  void on_proof();
  void on_frame();
  void on_ring_offer(const RingOffer& offer);
  void on_ring_switch();
  // Fails the group (its peers hear why) and ends the stream.
  void fail_stream(const std::string& reason);
  void read_next();
  void write(grpc::ByteBuffer message);
  // Ends the stream; a non-empty `reply` is written first, so the caller hears why.
  void refuse(grpc::StatusCode code, const std::string& reason, grpc::ByteBuffer reply = {});
  // The one way out: Finish, after any queued replies.
  void finish(grpc::Status status);
  void leave_handshake();
  std::string source() const;

  grpc::CallbackServerContext* ctx_;
  RankServer& server_;
  std::shared_ptr<Gate> gate_;
  State state_ = State::AwaitHello;
  bool in_handshake_ = false;
  bool finishing_ = false;
  grpc::ByteBuffer read_buffer_;
  std::deque<grpc::ByteBuffer> writes_;  // the front one is in flight
  std::optional<grpc::Status> finish_after_writes_;
  std::shared_ptr<ServedGroup> group_;
  Transcript transcript_;
  int src_ = -1;
  bool attached_ = false;
  bool observer_ = false;  // a monitoring tool: it reads the status and leaves
  bool ring_offered_ = false;
  std::shared_ptr<ReceiveRing> ring_;  // the caller's shared ring, once mapped
  std::unique_ptr<RingReader> ring_reader_;  // once the caller switched to the ring
};

}  // namespace tgpg
