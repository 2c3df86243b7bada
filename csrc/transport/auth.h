#pragma once

#include <cstdint>
#include <string>

namespace tgpg {

// The proofs and keys of the link handshake (protos/torch_grpc_pg.proto,
// message Hello). Each side proves that it holds the shared token by a MAC over
// everything the handshake agreed on, so the token itself never crosses the
// wire, and both sides derive the link's keys from the token and that same
// transcript: a relay that forwards a handshake gets a link it cannot use.

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // HMAC-SHA256
constexpr size_t kKeyBytes = 32;    // AES-256

// The link kinds and protections of the proto's LinkKind and Protection.
enum class LinkKind : uint32_t { Tcp = 0, Unix = 1 };
enum class Protection : uint32_t { None = 0, Mac = 1, Aead = 2 };
const char* link_kind_name(LinkKind kind);
const char* protection_name(Protection protection);

// What protects a caller's frames on a link, from the settings both ends hold:
// nothing without a token, and nothing on this host's unix socket, which only
// the ranks' own user can reach; else a MAC on every frame, encrypted too
// unless TLS already encrypts the link or `encrypt` is off.
Protection link_protection(bool has_token, LinkKind kind, bool tls, bool encrypt);

// What the caller claims in its Hello; the proofs and keys cover every field.
struct Transcript {
  uint32_t protocol_version = 0;
  std::string group_key;
  uint32_t src_rank = 0;  // the caller
  uint32_t dst_rank = 0;  // the server
  uint32_t world_size = 0;
  std::string settings;
  LinkKind link = LinkKind::Tcp;
  Protection protection = Protection::None;
  std::string caller_nonce;
};

// kNonceBytes from the operating system's CSPRNG; throws if it is unavailable.
std::string random_nonce();

// HMAC-SHA256(token, "caller proof" || transcript); empty without a token.
std::string caller_proof(const std::string& token, const Transcript& transcript);
// HMAC-SHA256(token, "server proof" || transcript || server nonce); empty without a token.
std::string server_proof(const std::string& token, const Transcript& transcript, const std::string& server_nonce);

// Compares `proof` with `expected` in time independent of where they differ.
bool proofs_match(const std::string& expected, const std::string& proof);

// The two keys of one link: HKDF-SHA256 of the token, salted with the hash of
// the transcript and the server's nonce. Empty without a token.
struct LinkKeys {
  std::string caller_to_server;  // protects the caller's frames
  std::string server_to_caller;  // protects what the server tells an observer
};
LinkKeys derive_link_keys(const std::string& token, const Transcript& transcript, const std::string& server_nonce);

// HKDF-SHA256 (RFC 5869) of `ikm` under `salt`, the first 32 bytes of its output for `info`.
std::string hkdf_sha256(const std::string& salt, const std::string& ikm, const std::string& info);

// HMAC-SHA256(key, message): the observer's status reply is signed with it.
std::string hmac_sha256(const std::string& key, const std::string& message);

}  // namespace tgpg
