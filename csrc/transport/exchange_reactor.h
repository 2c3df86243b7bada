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
#include "transport/call_peer.h"
#include "transport/frame_protection.h"
#include "transport/mailbox.h"
#include "transport/rank_server.h"
#include "transport/ring_reader.h"
#include "same_host/shared_ring.h"

namespace tgpg {

// Server side of one Exchange stream. The caller's Hello comes in the call's
// metadata, so the stream is authenticated, or refused, as it is created,
// before a single message of it is read: a stranger can make the rank buffer
// no more than gRPC's flow-control window holds, and only until the refusal.
// Once authenticated, the stream is bound to the (group, source rank) it
// proved, for the group's life; its messages are checked against the link's
// keys (when it has them) and its frames handed to that group's mailbox,
// pausing while the mailbox's queue for that peer is full. Once the caller
// switches to the shared ring it offered, a RingReader delivers its data frames
// instead, and the stream carries only aborts and the end.
//
// No exception leaves a reaction: gRPC would end the process. Whatever goes
// wrong in one refuses the stream, or fails the group once the stream speaks
// for a rank of it.
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
  // through it, and the ring reader reports through it.
  class Gate : public ReadGate {
   public:
    explicit Gate(ExchangeReactor* reactor) : reactor_(reactor) {}
    void resume() override;
    // From the ring reader's thread: it delivered everything, or refused a record.
    void finish_drained();
    void refuse_from_ring(const std::string& reason);
    void detach();
    std::recursive_mutex& mutex() { return mutex_; }

   private:
    std::recursive_mutex mutex_;
    ExchangeReactor* reactor_;
  };

  // All below run with the gate mutex held.
  void admit();
  // The Hello's checks that only a caller who proved the token (or any caller,
  // without one) may hear the outcome of; "" when all pass.
  std::string check_claims(const Transcript& claims);
  void welcome(const Transcript& claims);
  void on_frame();
  void on_ring_offer(const RingOffer& offer);
  void on_ring_switch();
  // Fails the group (its peers hear why) and ends the stream.
  void fail_stream(const std::string& reason);
  void read_next();
  void write(grpc::ByteBuffer message);
  // Ends the stream with `reason`, before it was admitted: to a caller that
  // has not proved the token, only that it was refused; the rank logs why.
  void refuse_before_proof(const std::string& reason);
  void refuse(grpc::StatusCode code, const std::string& reason);
  // The one way out: Finish, after any queued replies.
  void finish(grpc::Status status);
  std::string source() const;
  std::string link_name() const;

  grpc::CallbackServerContext* ctx_;
  RankServer& server_;
  std::shared_ptr<Gate> gate_;
  bool open_ = false;  // admitted as a rank of a group: its frames are read
  bool finishing_ = false;
  grpc::ByteBuffer read_buffer_;
  std::deque<grpc::ByteBuffer> writes_;  // the front one is in flight
  std::optional<grpc::Status> finish_after_writes_;
  std::shared_ptr<ServedGroup> group_;
  std::optional<CallPeer> peer_;
  std::unique_ptr<FrameOpener> opener_;  // on a link with keys
  int src_ = -1;
  bool observer_ = false;  // a monitoring tool: it reads the status and leaves
  bool ring_offered_ = false;
  std::shared_ptr<ReceiveRing> ring_;  // the caller's shared ring, once mapped
  std::unique_ptr<RingReader> ring_reader_;  // once the caller switched to the ring
};

}  // namespace tgpg
