#include "transport/handshake.h"

#include <stdexcept>

namespace tgpg {
namespace {

void check_size(const std::string& bytes, const char* what) {
  if (bytes.size() > kMaxHandshakeBytes) {
    throw std::runtime_error(std::string(what) + " of " + std::to_string(bytes.size()) + " bytes exceeds " +
                             std::to_string(kMaxHandshakeBytes));
  }
}

}  // namespace

std::string encode_hello(const Transcript& t, const std::string& proof) {
  torch_grpc_pg::Hello hello;
  hello.set_protocol_version(t.protocol_version);
  hello.set_group_key(t.group_key);
  hello.set_src_rank(t.src_rank);
  hello.set_dst_rank(t.dst_rank);
  hello.set_world_size(t.world_size);
  hello.set_nonce(t.caller_nonce);
  hello.set_settings(t.settings);
  hello.set_link(static_cast<torch_grpc_pg::LinkKind>(t.link));
  hello.set_protection(static_cast<torch_grpc_pg::Protection>(t.protection));
  hello.set_proof(proof);
  return hello.SerializeAsString();
}

ReceivedHello decode_hello(const std::string& bytes) {
  check_size(bytes, "the Hello");
  torch_grpc_pg::Hello hello;
  if (!hello.ParseFromString(bytes)) throw std::runtime_error("the Hello is not a valid message");
  // Enums of proto3 keep unknown values: each is checked, not cast blindly.
  if (hello.link() != torch_grpc_pg::LINK_KIND_TCP && hello.link() != torch_grpc_pg::LINK_KIND_UNIX) {
    throw std::runtime_error("the Hello names an unknown link kind " + std::to_string(hello.link()));
  }
  if (hello.protection() != torch_grpc_pg::PROTECTION_NONE && hello.protection() != torch_grpc_pg::PROTECTION_MAC &&
      hello.protection() != torch_grpc_pg::PROTECTION_AEAD) {
    throw std::runtime_error("the Hello names an unknown protection " + std::to_string(hello.protection()));
  }
  ReceivedHello out;
  Transcript& t = out.transcript;
  t.protocol_version = hello.protocol_version();
  t.group_key = hello.group_key();
  t.src_rank = hello.src_rank();
  t.dst_rank = hello.dst_rank();
  t.world_size = hello.world_size();
  t.settings = hello.settings();
  t.link = static_cast<LinkKind>(hello.link());
  t.protection = static_cast<Protection>(hello.protection());
  t.caller_nonce = hello.nonce();
  out.proof = hello.proof();
  return out;
}

std::string encode_welcome(const std::string& server_nonce, const std::string& proof) {
  torch_grpc_pg::Welcome welcome;
  welcome.set_nonce(server_nonce);
  welcome.set_proof(proof);
  return welcome.SerializeAsString();
}

torch_grpc_pg::Welcome decode_welcome(const std::string& bytes) {
  check_size(bytes, "the Welcome");
  torch_grpc_pg::Welcome welcome;
  if (!welcome.ParseFromString(bytes)) throw std::runtime_error("the Welcome is not a valid message");
  return welcome;
}

}  // namespace tgpg
