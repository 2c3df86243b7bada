#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <optional>

namespace tgpg {

// A contiguous host tensor that a collective works on in place of a user's
// tensor. A contiguous CPU tensor is its own stage and costs nothing. A
// non-contiguous one is packed now and unpacked at the end. A device tensor
// (CUDA or any other) is copied into pinned host memory, ordered after the
// work already queued on the caller's current stream.
class HostStage {
 public:
  // On the calling thread. `copy_in` is false for pure outputs.
  HostStage(const at::Tensor& user, bool copy_in);

  // On the worker thread, before the collective reads the stage.
  void wait_ready();
  // On the worker thread, after the collective: brings results back into the user's tensor.
  void write_back();

  at::Tensor& host() { return host_; }
  std::byte* data() { return static_cast<std::byte*>(host_.data_ptr()); }

 private:
  at::Tensor user_;
  at::Tensor host_;
  bool separate_;
  std::optional<c10::Event> copied_in_;
};

}  // namespace tgpg
