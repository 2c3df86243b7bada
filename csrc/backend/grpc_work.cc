#include "backend/grpc_work.h"

namespace tgpg {
namespace {

std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors) {
    if (!t.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

}  // namespace

GrpcWork::GrpcWork(int rank, c10d::OpType type, const char* profiling_title,
                   const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, profiling_title, inputs),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       devices_of(outputs_))) {}

void GrpcWork::complete() {
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

void GrpcWork::fail(std::exception_ptr error) {
  future_->setError(error);
  finish(error);
}

}  // namespace tgpg
