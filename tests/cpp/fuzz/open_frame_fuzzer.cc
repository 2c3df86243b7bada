// libFuzzer target: FrameOpener::open, then decode_message, on arbitrary
// messages cut into arbitrary slices, as a relay between two ranks may write
// them. Bit 2 of the control byte picks the protection (sealed or signed).
// The key is the seeds' (make_seeds), so that genuine messages get past the
// tag and the decoder behind it is explored too.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz_input.h"
#include "transport/frame_protection.h"
#include "transport/wire_format.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tgpg_fuzz::silence_protobuf_log();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::ByteBuffer buffer;
  if (!tgpg_fuzz::to_message(data, size, &buffer)) return 0;
  const auto protection = ((data[0] >> 2) & 1) ? tgpg::Protection::Mac : tgpg::Protection::Aead;
  constexpr size_t kMaxPayload = 4096;
  tgpg::FrameOpener opener(protection, tgpg_fuzz::kSeedKey, kMaxPayload + tgpg::kMaxHeaderBytes + tgpg::kFramingBytes);
  try {
    (void)tgpg::decode_message(opener.open(std::move(buffer)), kMaxPayload);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
