#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "torch_grpc_pg.pb.h"
#include "transport/auth.h"

namespace tgpg {

// The handshake (see Hello in protos/torch_grpc_pg.proto) travels in metadata:
// the caller's Hello in the call's, the server's Welcome in its initial
// metadata. It arrives before the peer has proved anything, so each is bounded
// well below what gRPC allows for metadata.
constexpr size_t kMaxHandshakeBytes = 4 << 10;

// What a rank that holds a token tells a caller that has not proved it, whatever
// the reason it refused; it logs the reason instead.
constexpr const char* kRefusedWithoutReason =
    "refused; a rank tells why only to a caller that proves it holds the rank's TORCH_GRPC_PG_AUTH_TOKEN, and "
    "logs why";

// The Hello that states `transcript`, with the caller's proof.
std::string encode_hello(const Transcript& transcript, const std::string& proof);

// A received Hello: its transcript and proof. Throws std::runtime_error, saying
// what was wrong, unless `bytes` is at most kMaxHandshakeBytes and a Hello.
struct ReceivedHello {
  Transcript transcript;
  std::string proof;
};
ReceivedHello decode_hello(const std::string& bytes);

std::string encode_welcome(const std::string& server_nonce, const std::string& proof);
// Throws std::runtime_error unless `bytes` is a Welcome of at most kMaxHandshakeBytes.
torch_grpc_pg::Welcome decode_welcome(const std::string& bytes);

}  // namespace tgpg
