#include "transport/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

namespace tgpg {
namespace {

// Length prefixes keep field boundaries unambiguous: ("ab", "c") and ("a", "bc")
// must not MAC alike.
void append_field(std::string& out, const std::string& field) {
  const uint64_t n = field.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += field;
}

void append_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string message_of(ProofRole role, const Transcript& t) {
  std::string out;
  append_field(out, "torch-grpc-pg link v2");
  append_field(out, role == ProofRole::Server ? "server" : "client");
  append_field(out, t.group_key);
  append_u32(out, t.src_rank);
  append_u32(out, t.dst_rank);
  append_u32(out, t.world_size);
  append_field(out, t.caller_nonce);
  append_field(out, t.server_nonce);
  return out;
}

}  // namespace

std::string random_nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw std::runtime_error("the system's random number generator failed; cannot authenticate peers");
  }
  return nonce;
}

std::string make_proof(const std::string& token, ProofRole role, const Transcript& transcript) {
  if (token.empty()) return {};
  const std::string message = message_of(role, transcript);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_size) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed; cannot authenticate peers");
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_size);
}

bool check_proof(const std::string& token, ProofRole role, const Transcript& transcript,
                 const std::string& proof) {
  const std::string expected = make_proof(token, role, transcript);
  if (proof.size() != expected.size()) return false;
  if (expected.empty()) return true;
  return CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

}  // namespace tgpg
