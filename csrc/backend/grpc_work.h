#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

namespace tgpg {

// The handle a collective call returns. It completes once the collective has
// finished on this rank and its outputs are final; its future then holds the
// output tensors, as DDP's communication hooks expect.
class GrpcWork : public c10d::Work {
 public:
  GrpcWork(int rank, c10d::OpType type, const char* profiling_title,
           const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  void complete();
  void fail(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace tgpg
