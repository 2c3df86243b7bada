// libFuzzer target: decode_message on arbitrary messages cut into arbitrary
// slices. Throwing std::runtime_error is the only acceptable way to refuse
// one; a crash, a sanitizer report or a leak is a bug.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "fuzz_input.h"
#include "transport/wire_format.h"

namespace {
// Small, so that the fuzzer reaches the payload limit as well as legal payloads.
constexpr size_t kMaxPayloadBytes = 256;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tgpg_fuzz::silence_protobuf_log();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::ByteBuffer buffer;
  if (!tgpg_fuzz::to_message(data, size, &buffer)) return 0;
  try {
    const tgpg::DecodedMessage message = tgpg::decode_message(std::move(buffer), kMaxPayloadBytes);
    const tgpg::ReceivedFrame& frame = message.frame;
    if (message.ring_slot && (message.ring_slot->bytes > kMaxPayloadBytes || !frame.payload.empty())) __builtin_trap();
    if (message.ring_switch && (message.ring_offer || message.ring_slot || !frame.payload.empty())) __builtin_trap();
    if (message.ring_offer) {
      volatile size_t token = message.ring_offer->token.size();
      (void)token;
    }
    // Read everything the frame claims to hold, so that a view past its
    // slice shows up under AddressSanitizer.
    if (frame.payload_bytes() > kMaxPayloadBytes) __builtin_trap();
    std::vector<std::byte> copy(frame.payload_bytes());
    frame.copy_payload_to(copy.data());
    volatile size_t sink = frame.header.error.size();
    (void)sink;
  } catch (const std::runtime_error&) {
  }
  return 0;
}
