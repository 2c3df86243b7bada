// Writes the seed corpora of the fuzz targets: well-formed frames and
// handshake messages, whole and cut into slices, so that the fuzzer starts
// from inputs that get past the first checks.
//   make_seeds FRAME_DIR HANDSHAKE_DIR SEALED_DIR

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "torch_grpc_pg.pb.h"
#include "transport/frame_protection.h"
#include "transport/handshake.h"
#include "transport/wire_format.h"

namespace {

using tgpg_fuzz::flatten;

int written = 0;

void write_seed(const std::string& dir, const std::vector<uint8_t>& control, const std::string& message) {
  const std::string path = dir + "/seed-" + std::to_string(written++);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(control.data()), static_cast<std::streamsize>(control.size()));
  out.write(message.data(), static_cast<std::streamsize>(message.size()));
  if (!out) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

// Whole, and cut in two and in four places that fall inside the header.
void write_cuts(const std::string& dir, const std::string& message, uint8_t target_bits) {
  write_seed(dir, tgpg_fuzz::layout({}, target_bits), message);
  write_seed(dir, tgpg_fuzz::layout({3}, target_bits), message);
  write_seed(dir, tgpg_fuzz::layout({1, 5, 2}, target_bits), message);
}

void frame_seeds(const std::string& dir) {
  tgpg::FrameHeader h;
  h.seq = 12;
  h.op = 1;
  h.dtype = 1;
  h.count = 1000;
  h.offset = 64;
  h.src_rank = 1;
  h.reduction = 1;
  const std::string payload(64, '\x3c');
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{64}}) {
    write_cuts(dir, flatten(tgpg::encode_frame(h, {reinterpret_cast<const std::byte*>(payload.data()), size}, nullptr)), 0);
  }
  tgpg::FrameHeader abort;
  abort.kind = tgpg::FrameKind::Abort;
  abort.src_rank = 2;
  abort.error = "rank 2 failed: out of memory";
  write_cuts(dir, flatten(tgpg::encode_frame(abort, {}, nullptr)), 0);
  write_cuts(dir, tgpg::encode_ring_frame(h, tgpg::RingSlot{3, 17, 64}), 0);
  write_cuts(dir, flatten(tgpg::encode_ring_switch()), 0);
  write_cuts(dir, flatten(tgpg::encode_ring_offer(tgpg::RingOffer{4242, 9, 8, 2 << 20, std::string(32, '\x55')})), 0);
}

void handshake_seeds(const std::string& dir) {
  tgpg::Transcript t;
  t.protocol_version = 7;
  t.group_key = "default_pg#0123456789abcdef";
  t.src_rank = 1;
  t.dst_rank = 0;
  t.world_size = 2;
  t.settings = "chunk_bytes=2097152 direct_max_bytes=65536";
  t.link = tgpg::LinkKind::Tcp;
  t.protection = tgpg::Protection::Aead;
  t.caller_nonce = std::string(32, '\x11');
  // The control bits name the message the target decodes: 0 a Hello, 1 a Welcome.
  write_cuts(dir, tgpg::encode_hello(t, std::string(32, '\x33')), 0);
  write_cuts(dir, tgpg::encode_welcome(std::string(32, '\x22'), std::string(32, '\x44')), 1);
}

// Sealed and signed messages under the open_frame_fuzzer's key, each the first
// of its link (the opener's count starts at 0): bit 2 of the control byte says
// which protection.
void sealed_seeds(const std::string& dir) {
  tgpg::FrameHeader h;
  h.seq = 1;
  h.op = 1;
  h.dtype = 1;
  h.count = 16;
  const std::string payload(64, '\x3f');
  const tgpg::ByteView view{reinterpret_cast<const std::byte*>(payload.data()), payload.size()};
  for (const auto protection : {tgpg::Protection::Aead, tgpg::Protection::Mac}) {
    tgpg::FrameSealer sealer(protection, tgpg_fuzz::kSeedKey);
    const int bits = protection == tgpg::Protection::Mac ? 1 : 0;
    write_cuts(dir, flatten(sealer.seal(tgpg::encode_frame_prefix(h, payload.size()), view, nullptr)), bits);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s FRAME_DIR HANDSHAKE_DIR SEALED_DIR\n", argv[0]);
    return 2;
  }
  frame_seeds(argv[1]);
  handshake_seeds(argv[2]);
  sealed_seeds(argv[3]);
  return 0;
}
