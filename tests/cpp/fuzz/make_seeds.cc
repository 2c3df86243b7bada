// Writes the seed corpora of the fuzz targets: well-formed frames and
// handshake messages, whole and cut into slices, so that the fuzzer starts
// from inputs that get past the first checks.
//   make_seeds FRAME_DIR HANDSHAKE_DIR

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "torch_grpc_pg.pb.h"
#include "transport/handshake.h"
#include "transport/wire_format.h"

namespace {

std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

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
  torch_grpc_pg::Frame hello;
  hello.mutable_hello()->set_protocol_version(2);
  hello.mutable_hello()->set_group_key("0:default_pg");
  hello.mutable_hello()->set_src_rank(1);
  hello.mutable_hello()->set_world_size(2);
  hello.mutable_hello()->set_nonce(std::string(32, '\x11'));
  torch_grpc_pg::Frame challenge;
  challenge.mutable_challenge()->set_nonce(std::string(32, '\x22'));
  challenge.mutable_challenge()->set_proof(std::string(32, '\x33'));
  torch_grpc_pg::Frame proof;
  proof.mutable_proof()->set_proof(std::string(32, '\x44'));
  torch_grpc_pg::Frame welcome;
  welcome.mutable_welcome()->set_error("refused: wrong token");
  // The control bits name the step the target expects (HandshakeStep order).
  write_cuts(dir, hello.SerializeAsString(), 0);
  write_cuts(dir, challenge.SerializeAsString(), 1);
  write_cuts(dir, proof.SerializeAsString(), 2);
  write_cuts(dir, welcome.SerializeAsString(), 3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FRAME_DIR HANDSHAKE_DIR\n", argv[0]);
    return 2;
  }
  frame_seeds(argv[1]);
  handshake_seeds(argv[2]);
  return 0;
}
