#include "transport/exchange_reactor.h"

#include <string>

#include "transport/wire_format.h"

namespace tgpg {

ExchangeReactor::ExchangeReactor(std::shared_ptr<Mailbox> mailbox, int src, int rank,
                                 const grpc::Status& refusal)
    : mailbox_(std::move(mailbox)), gate_(std::make_shared<Gate>(this)), src_(src), rank_(rank) {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (!mailbox_) {
    finish(refusal);
    return;
  }
  read_next();
}

void ExchangeReactor::read_next() { StartRead(&buffer_); }

void ExchangeReactor::finish(grpc::Status status) {
  if (finished_) return;
  finished_ = true;
  Finish(std::move(status));
}

void ExchangeReactor::OnReadDone(bool ok) {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (!ok) {
    mailbox_->close_source(src_, "rank " + std::to_string(src_) + " closed its connection to rank " +
                                     std::to_string(rank_) +
                                     " (it exited, crashed, or destroyed the process group)");
    finish(grpc::Status::OK);
    return;
  }
  ReceivedFrame frame;
  try {
    frame = decode_frame(std::move(buffer_));
  } catch (const std::exception& e) {
    const std::string reason = "rank " + std::to_string(src_) + " sent an unreadable frame (" +
                               e.what() + "); are both ranks running the same torch-grpc-pg version?";
    mailbox_->fail(reason);
    finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, reason));
    return;
  }
  buffer_.Clear();
  if (frame.header.kind == FrameKind::Abort) {
    mailbox_->fail("rank " + std::to_string(src_) + " failed: " + frame.header.error);
    read_next();
    return;
  }
  if (mailbox_->deliver(src_, std::move(frame), gate)) read_next();
}

void ExchangeReactor::OnCancel() {
  auto gate = gate_;
  std::lock_guard<std::recursive_mutex> lock(gate->mutex());
  if (mailbox_) {
    mailbox_->close_source(src_, "the connection from rank " + std::to_string(src_) + " to rank " +
                                     std::to_string(rank_) + " broke (rank " + std::to_string(src_) +
                                     " may have crashed)");
  }
  finish(grpc::Status::CANCELLED);
}

void ExchangeReactor::OnDone() {
  gate_->detach();
  delete this;  // the callback API's ownership rule for server reactors
}

void ExchangeReactor::Gate::resume() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (reactor_ != nullptr && !reactor_->finished_) reactor_->read_next();
}

void ExchangeReactor::Gate::detach() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  reactor_ = nullptr;
}

}  // namespace tgpg
