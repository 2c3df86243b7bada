#include "transport/handshake.h"

#include <grpcpp/support/slice.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace tgpg {
namespace {

int steps_present(const torch_grpc_pg::Frame& m) {
  return int{m.has_hello()} + int{m.has_challenge()} + int{m.has_proof()} + int{m.has_welcome()};
}

bool holds(const torch_grpc_pg::Frame& m, HandshakeStep step) {
  switch (step) {
    case HandshakeStep::Hello: return m.has_hello();
    case HandshakeStep::Challenge: return m.has_challenge();
    case HandshakeStep::Proof: return m.has_proof();
    case HandshakeStep::Welcome: return m.has_welcome();
  }
  return false;
}

}  // namespace

const char* handshake_step_name(HandshakeStep step) {
  switch (step) {
    case HandshakeStep::Hello: return "Hello";
    case HandshakeStep::Challenge: return "Challenge";
    case HandshakeStep::Proof: return "Proof";
    case HandshakeStep::Welcome: return "Welcome";
  }
  return "unknown step";
}

grpc::ByteBuffer encode_handshake(const torch_grpc_pg::Frame& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

torch_grpc_pg::Frame decode_handshake(const grpc::ByteBuffer& buffer, HandshakeStep expected) {
  const std::string what = std::string("handshake ") + handshake_step_name(expected);
  if (buffer.Length() > kMaxHandshakeBytes) {
    throw std::runtime_error(what + " of " + std::to_string(buffer.Length()) + " bytes exceeds " +
                             std::to_string(kMaxHandshakeBytes));
  }
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) throw std::runtime_error(what + " is unreadable");
  std::string bytes;
  bytes.reserve(buffer.Length());
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  torch_grpc_pg::Frame message;
  if (!message.ParseFromString(bytes)) throw std::runtime_error(what + " is not a valid message");
  if (message.has_header() || !message.payload().empty() || steps_present(message) != 1 ||
      !holds(message, expected)) {
    throw std::runtime_error("expected a " + what + " message; got something else. Is the peer a "
                             "torch-grpc-pg rank of the same release?");
  }
  return message;
}

}  // namespace tgpg
