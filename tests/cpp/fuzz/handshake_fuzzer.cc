// libFuzzer target: decode_hello and decode_welcome on arbitrary bytes, as
// they come in a call's metadata before a peer has proved anything, so
// refusing them must be safe. The control byte picks the message.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz_input.h"
#include "transport/handshake.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tgpg_fuzz::silence_protobuf_log();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::ByteBuffer buffer;
  if (!tgpg_fuzz::to_message(data, size, &buffer)) return 0;
  const std::string bytes = tgpg_fuzz::flatten(buffer);
  try {
    if ((data[0] >> 2) & 1) {
      (void)tgpg::decode_welcome(bytes);
    } else {
      const tgpg::ReceivedHello hello = tgpg::decode_hello(bytes);
      // What was accepted names a known link kind and protection only.
      if (static_cast<uint32_t>(hello.transcript.link) > 1 || static_cast<uint32_t>(hello.transcript.protection) > 2) {
        __builtin_trap();
      }
    }
    if (bytes.size() > tgpg::kMaxHandshakeBytes) __builtin_trap();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
