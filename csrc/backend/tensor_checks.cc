#include "backend/tensor_checks.h"

#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

namespace tgpg {

std::shared_ptr<void> keep_alive(std::vector<at::Tensor> tensors) {
  return std::make_shared<std::vector<at::Tensor>>(std::move(tensors));
}

void check_dense(const at::Tensor& t, const std::string& where) {
  TORCH_CHECK(t.layout() == at::kStrided, where,
              ": sparse tensors are not supported by the grpc backend; call .to_dense() first.");
}

void check_output(const at::Tensor& t, const std::string& where) {
  check_dense(t, where);
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, where,
              ": the output tensor has elements that share memory (an expanded view, such as "
              "torch.zeros(1).expand(4)), so results cannot be written into it. Pass a tensor whose elements "
              "have memory of their own, such as t.clone().");
}

void check_same_dtype(const at::Tensor& expected, const at::Tensor& t, const std::string& where,
                      const char* what) {
  TORCH_CHECK(t.scalar_type() == expected.scalar_type(), where, ": every ", what, " must have dtype ",
              expected.scalar_type(), ", got ", t.scalar_type(), ".");
}

void check_same_kind(const at::Tensor& expected, const at::Tensor& t, const std::string& where,
                     const char* what) {
  check_same_dtype(expected, t, where, what);
  TORCH_CHECK(t.numel() == expected.numel(), where, ": every ", what, " must have ", expected.numel(),
              " elements, got ", t.numel(), ".");
}

void copy_into(at::Tensor& dst, const at::Tensor& src) {
  c10::OptionalDeviceGuard guard;
  if (!dst.device().is_cpu()) guard.reset_device(dst.device());
  dst.copy_(src.view(dst.sizes()));
}

}  // namespace tgpg
