#include "backend/grpc_work.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <optional>

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

void log_callback_error(const char* what) {
  try {
    LOG(WARNING) << "grpc backend: a callback on a collective's future raised: " << what
                 << " (the error is contained; the process group is unaffected)";
  } catch (...) {
  }
}

// Settling a future runs the user's callbacks; whatever they throw stays here.
template <typename Settle>
void containing_callback_errors(Settle&& settle) noexcept {
  try {
    settle();
  } catch (const c10::Error& e) {
    log_callback_error(e.what_without_backtrace());
  } catch (const std::exception& e) {
    log_callback_error(e.what());
  } catch (...) {
    log_callback_error("an exception of unknown type");
  }
}

}  // namespace

// torch's Work opens a profiler event for a title, and copies the inputs for
// their shapes, on every call: an allocation and a copy each time, whether or
// not a profiler listens. With no callbacks registered that event would be
// inactive, so the title and inputs are given only while a profiler listens
// (tests/test_profiler.py holds the events to gloo's).
GrpcWork::GrpcWork(int rank, c10d::OpType type, const char* profiling_title,
                   const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs)
    : GrpcWork(at::hasCallbacks(), rank, type, profiling_title, inputs, std::move(outputs)) {}

GrpcWork::GrpcWork(bool profiled, int rank, c10d::OpType type, const char* profiling_title,
                   const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, profiled ? profiling_title : nullptr,
                 profiled ? std::optional<std::vector<at::Tensor>>(inputs) : std::nullopt),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), devices_of(outputs_))) {}

// The future first, then the Work, as ProcessGroupGloo does: whoever returns
// from wait() may read the future's value at once.
void GrpcWork::complete() noexcept {
  if (settled_.exchange(true)) return;
  containing_callback_errors([&] { future_->markCompleted(c10::IValue(outputs_)); });
  try {
    finish();
  } catch (...) {
  }
}

void GrpcWork::fail(std::exception_ptr error) noexcept {
  if (settled_.exchange(true)) return;
  containing_callback_errors([&] { future_->setErrorIfNeeded(error); });
  try {
    finish(error);
  } catch (...) {
  }
}

int GrpcWork::sourceRank() const {
  const int rank = source_rank_.load();
  TORCH_CHECK(rank >= 0, "sourceRank() is known only for a receive, once it has completed.");
  return rank;
}

}  // namespace tgpg
