#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <memory>
#include <mutex>

#include "transport/mailbox.h"

namespace tgpg {

// Server side of one peer's Exchange stream: reads frames and hands them to
// the group's mailbox, pausing while the mailbox's queue for that peer is full.
class ExchangeReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `mailbox` may be null: then the stream is refused with `refusal`.
  ExchangeReactor(std::shared_ptr<Mailbox> mailbox, int src, int rank, const grpc::Status& refusal);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // gRPC may run a reaction inline, inside the Start* or Finish call that
  // caused it, and OnDone deletes the reactor. The gate therefore lives apart
  // from the reactor, and its mutex is recursive.
  class Gate : public ReadGate {
   public:
    explicit Gate(ExchangeReactor* reactor) : reactor_(reactor) {}
    void resume() override;
    void detach();
    std::recursive_mutex& mutex() { return mutex_; }

   private:
    std::recursive_mutex mutex_;
    ExchangeReactor* reactor_;
  };

  void read_next();             // gate mutex held
  void finish(grpc::Status s);  // gate mutex held; may delete this

  std::shared_ptr<Mailbox> mailbox_;
  std::shared_ptr<Gate> gate_;
  grpc::ByteBuffer buffer_;
  int src_;
  int rank_;
  bool finished_ = false;
};

}  // namespace tgpg
