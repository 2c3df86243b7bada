// The handshake: the Hello and the Welcome as they travel in metadata, and
// everything else a peer that has proved nothing yet might send instead; the
// proofs and keys derived from what the Hello claims.

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "torch_grpc_pg.pb.h"
#include "transport/auth.h"
#include "transport/handshake.h"

namespace tgpg_test {
namespace {

using tgpg::LinkKind;
using tgpg::Protection;
using tgpg::Transcript;

Transcript claims() {
  Transcript t;
  t.protocol_version = 7;
  t.group_key = "default_pg#0011223344556677";
  t.src_rank = 3;
  t.dst_rank = 1;
  t.world_size = 4;
  t.settings = "chunk_bytes=2097152 direct_max_bytes=65536";
  t.link = LinkKind::Tcp;
  t.protection = Protection::Aead;
  t.caller_nonce = std::string(32, '\x5a');
  return t;
}

std::string hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) out += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

TEST(Handshake, AHelloSaysWhatItClaimsAndItsProof) {
  const tgpg::ReceivedHello got = tgpg::decode_hello(tgpg::encode_hello(claims(), std::string(32, '\x07')));
  const Transcript& t = got.transcript;
  const Transcript want = claims();
  EXPECT_EQ(t.protocol_version, want.protocol_version);
  EXPECT_EQ(t.group_key, want.group_key);
  EXPECT_EQ(t.src_rank, want.src_rank);
  EXPECT_EQ(t.dst_rank, want.dst_rank);
  EXPECT_EQ(t.world_size, want.world_size);
  EXPECT_EQ(t.settings, want.settings);
  EXPECT_EQ(t.link, want.link);
  EXPECT_EQ(t.protection, want.protection);
  EXPECT_EQ(t.caller_nonce, want.caller_nonce);
  EXPECT_EQ(got.proof, std::string(32, '\x07'));
}

TEST(Handshake, WhatIsNoHelloIsRefused) {
  EXPECT_THROW(tgpg::decode_hello(std::string("\xff\xff\xff", 3)), std::runtime_error);
  // A Hello of more than kMaxHandshakeBytes, however valid.
  Transcript big = claims();
  big.group_key.assign(tgpg::kMaxHandshakeBytes, 'g');
  EXPECT_THROW(tgpg::decode_hello(tgpg::encode_hello(big, "")), std::runtime_error);
  // A link kind or protection this release does not know.
  torch_grpc_pg::Hello unknown;
  unknown.set_link(static_cast<torch_grpc_pg::LinkKind>(7));
  EXPECT_THROW(tgpg::decode_hello(unknown.SerializeAsString()), std::runtime_error);
  unknown.set_link(torch_grpc_pg::LINK_KIND_UNIX);
  unknown.set_protection(static_cast<torch_grpc_pg::Protection>(9));
  EXPECT_THROW(tgpg::decode_hello(unknown.SerializeAsString()), std::runtime_error);
}

TEST(Handshake, AWelcomeCarriesTheServersNonceAndProof) {
  const auto welcome = tgpg::decode_welcome(tgpg::encode_welcome(std::string(32, 'n'), std::string(32, 'p')));
  EXPECT_EQ(welcome.nonce(), std::string(32, 'n'));
  EXPECT_EQ(welcome.proof(), std::string(32, 'p'));
  EXPECT_THROW(tgpg::decode_welcome(std::string(tgpg::kMaxHandshakeBytes + 1, '\x0a')), std::runtime_error);
}

// Every field the Hello claims, changed one at a time.
const std::vector<std::function<void(Transcript&)>> kChanges = {
    [](Transcript& t) { t.protocol_version += 1; },
    [](Transcript& t) { t.group_key += "x"; },
    [](Transcript& t) { t.src_rank += 1; },
    [](Transcript& t) { t.dst_rank += 1; },
    [](Transcript& t) { t.world_size += 1; },
    [](Transcript& t) { t.settings += " x=1"; },
    [](Transcript& t) { t.link = LinkKind::Unix; },
    [](Transcript& t) { t.protection = Protection::Mac; },
    [](Transcript& t) { t.caller_nonce[0] ^= 1; },
};

TEST(Auth, ProofsAndKeysCoverEveryClaim) {
  const std::string token = "the-token", server_nonce(32, '\x42');
  const Transcript base = claims();
  const std::string caller = tgpg::caller_proof(token, base);
  const std::string server = tgpg::server_proof(token, base, server_nonce);
  const tgpg::LinkKeys keys = tgpg::derive_link_keys(token, base, server_nonce);
  ASSERT_EQ(caller.size(), tgpg::kProofBytes);
  ASSERT_EQ(keys.caller_to_server.size(), tgpg::kKeyBytes);
  EXPECT_NE(caller, server);
  EXPECT_NE(keys.caller_to_server, keys.server_to_caller);
  for (size_t i = 0; i < kChanges.size(); ++i) {
    Transcript changed = base;
    kChanges[i](changed);
    EXPECT_FALSE(tgpg::proofs_match(caller, tgpg::caller_proof(token, changed))) << "change " << i;
    EXPECT_FALSE(tgpg::proofs_match(server, tgpg::server_proof(token, changed, server_nonce))) << "change " << i;
    EXPECT_NE(keys.caller_to_server, tgpg::derive_link_keys(token, changed, server_nonce).caller_to_server)
        << "change " << i;
  }
  // The server's nonce makes every link's keys its own, even for a replayed Hello.
  std::string other_nonce = server_nonce;
  other_nonce[31] ^= 1;
  EXPECT_NE(keys.caller_to_server, tgpg::derive_link_keys(token, base, other_nonce).caller_to_server);
  EXPECT_FALSE(tgpg::proofs_match(server, tgpg::server_proof(token, base, other_nonce)));
  EXPECT_FALSE(tgpg::proofs_match(caller, tgpg::caller_proof("another-token", base)));
}

TEST(Auth, WithoutATokenThereIsNothingToProveAndNoKey) {
  EXPECT_TRUE(tgpg::caller_proof("", claims()).empty());
  EXPECT_TRUE(tgpg::proofs_match(tgpg::caller_proof("", claims()), ""));
  EXPECT_FALSE(tgpg::proofs_match(tgpg::caller_proof("t", claims()), ""));
  EXPECT_TRUE(tgpg::derive_link_keys("", claims(), std::string(32, 'n')).caller_to_server.empty());
}

TEST(Auth, HkdfMatchesRfc5869) {
  // RFC 5869, A.1 (SHA-256): the first 32 of the 42 bytes of OKM.
  const std::string ikm(22, '\x0b');
  const std::string salt = unhex("000102030405060708090a0b0c");
  const std::string info = unhex("f0f1f2f3f4f5f6f7f8f9");
  EXPECT_EQ(hex(tgpg::hkdf_sha256(salt, ikm, info)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf");
}

TEST(Auth, WhatProtectsALink) {
  using tgpg::link_protection;
  EXPECT_EQ(link_protection(false, LinkKind::Tcp, false, true), Protection::None);
  EXPECT_EQ(link_protection(true, LinkKind::Unix, false, true), Protection::None);
  EXPECT_EQ(link_protection(true, LinkKind::Tcp, false, true), Protection::Aead);
  EXPECT_EQ(link_protection(true, LinkKind::Tcp, false, false), Protection::Mac);
  EXPECT_EQ(link_protection(true, LinkKind::Tcp, true, true), Protection::Mac);
}

}  // namespace
}  // namespace tgpg_test
