#include "backend/host_staging.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tgpg {

HostStage::HostStage(const at::Tensor& user, bool copy_in) : user_(user) {
  if (user.device().is_cpu()) {
    separate_ = !user.is_contiguous();
    host_ = separate_ ? (copy_in ? user.contiguous() : at::empty(user.sizes(), user.options())) : user;
    return;
  }
  separate_ = true;
  host_ = at::empty(user.sizes(), user.options().device(at::kCPU).pinned_memory(true));
  if (copy_in) {
    c10::impl::VirtualGuardImpl impl(user.device().type());
    host_.copy_(user, /*non_blocking=*/true);
    copied_in_.emplace(user.device().type());
    copied_in_->record(impl.getStream(user.device()));
  }
}

void HostStage::wait_ready() {
  if (copied_in_) copied_in_->synchronize();
}

void HostStage::write_back() {
  if (!separate_) return;
  if (user_.device().is_cpu()) {
    user_.copy_(host_);
    return;
  }
  // A side stream, so that the copy does not wait behind the caller's queued work;
  // waiting for it here keeps the pinned buffer alive until it is done.
  const c10::Device device = user_.device();
  c10::DeviceGuard device_guard(device);
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::StreamGuard stream_guard(impl.getStreamFromGlobalPool(device));
  user_.copy_(host_, /*non_blocking=*/true);
  c10::Event done(device.type());
  done.record(impl.getStream(device));
  done.synchronize();
}

}  // namespace tgpg
