#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <exception>
#include <vector>

namespace tgpg {

// The handle a collective call returns. It completes once the collective has
// finished on this rank and its outputs are final; its future then holds the
// output tensors, as DDP's communication hooks expect.
//
// complete() and fail() settle the work once: whichever comes first wins and
// the other does nothing, so a failure path never touches a completed future.
// They run the future's callbacks (user code) and never throw: a callback's
// exception is logged and contained; torch's then() already turns it into the
// error of the chained future.
class GrpcWork : public c10d::Work {
 public:
  GrpcWork(int rank, c10d::OpType type, const char* profiling_title,
           const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Call without holding any lock: these run user callbacks.
  void complete() noexcept;
  void fail(std::exception_ptr error) noexcept;

  // For a receive: the rank its message came from (recv(src=None) reads it).
  void set_source_rank(int rank) { source_rank_.store(rank); }
  int sourceRank() const override;

 private:
  GrpcWork(bool profiled, int rank, c10d::OpType type, const char* profiling_title,
           const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> outputs_;
  std::atomic<int> source_rank_{-1};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> settled_{false};
};

}  // namespace tgpg
