#include "algorithms/frame.h"

#include <cstring>


namespace tgpg {

size_t ReceivedFrame::payload_bytes() const {
  size_t total = 0;
  for (const auto& view : payload) total += view.size;
  return total;
}

void ReceivedFrame::copy_payload_to(void* dst) const {
  copy_payload_to(dst, [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); });
}

void ReceivedFrame::copy_payload_to(void* dst, CopyFn copy) const {
  auto* out = static_cast<std::byte*>(dst);
  for (const auto& view : payload) {
    copy(out, view.data, view.size);
    out += view.size;
  }
}

}  // namespace tgpg
