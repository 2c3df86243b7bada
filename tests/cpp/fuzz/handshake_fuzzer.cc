// libFuzzer target: decode_handshake on arbitrary messages cut into arbitrary
// slices, expecting whichever step the control byte names. These messages
// arrive before a peer has proved anything, so refusing them must be safe.

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "fuzz_input.h"
#include "transport/handshake.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tgpg_fuzz::silence_protobuf_log();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::ByteBuffer buffer;
  if (!tgpg_fuzz::to_message(data, size, &buffer)) return 0;
  const auto expected = static_cast<tgpg::HandshakeStep>((data[0] >> 2) & 3);
  try {
    const torch_grpc_pg::Frame message = tgpg::decode_handshake(buffer, expected);
    // What was accepted must be the step asked for and nothing else.
    const int steps = int{message.has_hello()} + int{message.has_challenge()} + int{message.has_proof()} +
                      int{message.has_welcome()};
    if (steps != 1 || message.has_header() || !message.payload().empty()) __builtin_trap();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
