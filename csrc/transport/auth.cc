#include "transport/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

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

// The layout that torch_grpc_pg/wire.py's transcript() writes too.
std::string transcript_bytes(const Transcript& t) {
  std::string out;
  append_field(out, "torch-grpc-pg link v7");
  append_u32(out, t.protocol_version);
  append_field(out, t.group_key);
  append_u32(out, t.src_rank);
  append_u32(out, t.dst_rank);
  append_u32(out, t.world_size);
  append_field(out, t.settings);
  append_u32(out, static_cast<uint32_t>(t.link));
  append_u32(out, static_cast<uint32_t>(t.protection));
  append_field(out, t.caller_nonce);
  return out;
}

std::string with_server_nonce(const Transcript& t, const std::string& server_nonce) {
  std::string out = transcript_bytes(t);
  append_field(out, server_nonce);
  return out;
}

std::string labelled(const char* label, const std::string& message) {
  std::string out;
  append_field(out, label);
  return out + message;
}

}  // namespace

const char* link_kind_name(LinkKind kind) { return kind == LinkKind::Unix ? "unix socket" : "TCP"; }

const char* protection_name(Protection protection) {
  switch (protection) {
    case Protection::None: return "none";
    case Protection::Mac: return "authenticated frames";
    case Protection::Aead: return "encrypted frames";
  }
  return "unknown";
}

Protection link_protection(bool has_token, LinkKind kind, bool tls, bool encrypt) {
  if (!has_token || kind == LinkKind::Unix) return Protection::None;
  return tls || !encrypt ? Protection::Mac : Protection::Aead;
}

std::string random_nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw std::runtime_error("the system's random number generator failed; cannot authenticate peers");
  }
  return nonce;
}

std::string hmac_sha256(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_size) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed; cannot authenticate peers");
  }
  return std::string(reinterpret_cast<const char*>(mac), mac_size);
}

std::string caller_proof(const std::string& token, const Transcript& transcript) {
  if (token.empty()) return {};
  return hmac_sha256(token, labelled("caller proof", transcript_bytes(transcript)));
}

std::string server_proof(const std::string& token, const Transcript& transcript, const std::string& server_nonce) {
  if (token.empty()) return {};
  return hmac_sha256(token, labelled("server proof", with_server_nonce(transcript, server_nonce)));
}

bool proofs_match(const std::string& expected, const std::string& proof) {
  if (proof.size() != expected.size()) return false;
  if (expected.empty()) return true;
  return CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

std::string hkdf_sha256(const std::string& salt, const std::string& ikm, const std::string& info) {
  const std::string pseudo_random_key = hmac_sha256(salt, ikm);  // extract
  return hmac_sha256(pseudo_random_key, info + '\x01');           // expand: the first block
}

LinkKeys derive_link_keys(const std::string& token, const Transcript& transcript, const std::string& server_nonce) {
  if (token.empty()) return {};
  // The salt names this very handshake: both nonces, and everything claimed.
  const std::string context = with_server_nonce(transcript, server_nonce);
  unsigned char salt[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(context.data()), context.size(), salt);
  const std::string salt_bytes(reinterpret_cast<const char*>(salt), sizeof(salt));
  return LinkKeys{hkdf_sha256(salt_bytes, token, "caller to server"), hkdf_sha256(salt_bytes, token, "server to caller")};
}

}  // namespace tgpg
