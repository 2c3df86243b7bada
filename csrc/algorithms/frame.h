#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tgpg {

enum class FrameKind : uint32_t { Data = 0, Abort = 1 };

// What every frame says about itself, so that the receiver can check that both
// ranks are running the same collective on the same shapes.
struct FrameHeader {
  FrameKind kind = FrameKind::Data;
  uint64_t seq = 0;
  uint32_t op = 0;
  uint32_t dtype = 0;
  uint64_t count = 0;
  uint64_t offset = 0;
  uint32_t src_rank = 0;
  uint32_t root = 0;
  uint32_t reduction = 0;  // reduction_code() of the collective's reduction
  uint32_t schedule = 0;   // Collective::Schedule the sender runs
  int64_t tag = 0;         // point-to-point messages: the sender's tag
  std::string error;
};

struct ByteView {
  const std::byte* data = nullptr;
  size_t size = 0;
};

// A frame as it came off the network: its payload is a list of views into
// receive buffers that `owner` keeps alive, so data is reduced or copied
// straight from them.
struct ReceivedFrame {
  FrameHeader header;
  std::vector<ByteView> payload;
  std::shared_ptr<const void> owner;
  // Set by Collective::recv: the payload holds the collective's float32
  // values narrowed to its wire dtype (they came from another host).
  bool narrowed = false;

  size_t payload_bytes() const;
  // Copies the payload's views one after another to `dst`, each with `copy`
  // (memcpy's arguments), or with memcpy.
  using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
  void copy_payload_to(void* dst) const;
  void copy_payload_to(void* dst, CopyFn copy) const;
};

}  // namespace tgpg
