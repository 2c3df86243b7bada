#pragma once

#include <cstdint>
#include <string>

namespace tgpg {

// The proofs of the link handshake (protos/torch_grpc_pg.proto, message Hello).
// Each side proves that it holds the shared token by a MAC over everything
// the handshake agreed on, so the token itself never crosses the wire and a
// proof is worth nothing on any other link, group or pair of nonces.

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // HMAC-SHA256

// What both ends of one link agreed on; the MAC covers every field.
struct Transcript {
  std::string group_key;
  uint32_t src_rank = 0;  // the caller
  uint32_t dst_rank = 0;  // the server
  uint32_t world_size = 0;
  std::string caller_nonce;
  std::string server_nonce;
};

enum class ProofRole { Server, Caller };

// kNonceBytes from the operating system's CSPRNG; throws if it is unavailable.
std::string random_nonce();

// HMAC-SHA256(token, role label || length-prefixed transcript). Empty when the
// token is empty: without a shared secret there is nothing to prove.
std::string make_proof(const std::string& token, ProofRole role, const Transcript& transcript);

// Compares `proof` with the expected one in time independent of where they differ.
bool check_proof(const std::string& token, ProofRole role, const Transcript& transcript,
                 const std::string& proof);

}  // namespace tgpg
