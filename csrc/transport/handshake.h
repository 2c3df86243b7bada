#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>

#include "torch_grpc_pg.pb.h"

namespace tgpg {

// The four handshake messages that open every Exchange stream (see Hello in
// protos/torch_grpc_pg.proto). They arrive before the peer has proved
// anything, so each is bounded well below a data frame.
constexpr size_t kMaxHandshakeBytes = 4 << 10;

enum class HandshakeStep { Hello, Challenge, Proof, Welcome };
const char* handshake_step_name(HandshakeStep step);

grpc::ByteBuffer encode_handshake(const torch_grpc_pg::Frame& message);

// Parses one handshake message. Throws std::runtime_error, saying what was
// wrong, unless `buffer` is at most kMaxHandshakeBytes and holds exactly the
// `expected` step and nothing else.
torch_grpc_pg::Frame decode_handshake(const grpc::ByteBuffer& buffer, HandshakeStep expected);

}  // namespace tgpg
