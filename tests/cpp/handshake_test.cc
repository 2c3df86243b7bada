// decode_handshake: each of the four handshake messages, and everything else
// a peer that has proved nothing yet might send instead.

#include <gtest/gtest.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <string>
#include <vector>

#include "torch_grpc_pg.pb.h"
#include "transport/handshake.h"

namespace tgpg_test {
namespace {

using tgpg::HandshakeStep;

const HandshakeStep kSteps[] = {HandshakeStep::Hello, HandshakeStep::Challenge, HandshakeStep::Proof,
                                HandshakeStep::Welcome};

torch_grpc_pg::Frame message_for(HandshakeStep step) {
  torch_grpc_pg::Frame m;
  switch (step) {
    case HandshakeStep::Hello: {
      auto* hello = m.mutable_hello();
      hello->set_protocol_version(2);
      hello->set_group_key("group-7");
      hello->set_src_rank(3);
      hello->set_dst_rank(1);
      hello->set_world_size(4);
      hello->set_nonce(std::string(32, '\x5a'));
      break;
    }
    case HandshakeStep::Challenge:
      m.mutable_challenge()->set_nonce(std::string(32, '\x01'));
      m.mutable_challenge()->set_proof(std::string(32, '\x02'));
      break;
    case HandshakeStep::Proof: m.mutable_proof()->set_proof(std::string(32, '\x03')); break;
    case HandshakeStep::Welcome: m.mutable_welcome(); break;  // present, and empty: accepted
  }
  return m;
}

// `bytes` as a message of copied slices, one cut every `step` bytes.
grpc::ByteBuffer sliced(const std::string& bytes, size_t step) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += step) slices.emplace_back(bytes.data() + at, std::min(step, bytes.size() - at));
  if (slices.empty()) slices.emplace_back(bytes.data(), 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(Handshake, EveryStepRoundTrips) {
  for (HandshakeStep step : kSteps) {
    SCOPED_TRACE(tgpg::handshake_step_name(step));
    const torch_grpc_pg::Frame sent = message_for(step);
    const torch_grpc_pg::Frame got = tgpg::decode_handshake(tgpg::encode_handshake(sent), step);
    EXPECT_EQ(got.SerializeAsString(), sent.SerializeAsString());
    // Cut into small slices, as gRPC may deliver it.
    const torch_grpc_pg::Frame again = tgpg::decode_handshake(sliced(sent.SerializeAsString(), 3), step);
    EXPECT_EQ(again.SerializeAsString(), sent.SerializeAsString());
  }
}

TEST(Handshake, RejectsEveryOtherStep) {
  for (HandshakeStep sent : kSteps) {
    for (HandshakeStep expected : kSteps) {
      if (sent == expected) continue;
      EXPECT_THROW(tgpg::decode_handshake(tgpg::encode_handshake(message_for(sent)), expected), std::runtime_error)
          << "sent " << tgpg::handshake_step_name(sent) << ", expected " << tgpg::handshake_step_name(expected);
    }
  }
}

TEST(Handshake, RejectsMixedMessages) {
  torch_grpc_pg::Frame two = message_for(HandshakeStep::Hello);
  two.mutable_proof()->set_proof("p");
  EXPECT_THROW(tgpg::decode_handshake(tgpg::encode_handshake(two), HandshakeStep::Hello), std::runtime_error);

  torch_grpc_pg::Frame with_header = message_for(HandshakeStep::Hello);
  with_header.mutable_header()->set_seq(1);
  EXPECT_THROW(tgpg::decode_handshake(tgpg::encode_handshake(with_header), HandshakeStep::Hello), std::runtime_error);

  torch_grpc_pg::Frame with_payload = message_for(HandshakeStep::Hello);
  with_payload.set_payload("data before the handshake is done");
  EXPECT_THROW(tgpg::decode_handshake(tgpg::encode_handshake(with_payload), HandshakeStep::Hello), std::runtime_error);

  EXPECT_THROW(tgpg::decode_handshake(tgpg::encode_handshake(torch_grpc_pg::Frame()), HandshakeStep::Welcome),
               std::runtime_error)
      << "an empty message holds no step at all";
}

TEST(Handshake, RejectsOversizedAndMalformedMessages) {
  torch_grpc_pg::Frame big = message_for(HandshakeStep::Hello);
  big.mutable_hello()->set_group_key(std::string(tgpg::kMaxHandshakeBytes, 'k'));
  EXPECT_THROW(tgpg::decode_handshake(tgpg::encode_handshake(big), HandshakeStep::Hello), std::runtime_error);
  EXPECT_THROW(tgpg::decode_handshake(sliced(std::string("\x1a\x05\x0a\x03", 4), 1), HandshakeStep::Hello),
               std::runtime_error)
      << "truncated";
  EXPECT_THROW(tgpg::decode_handshake(sliced(std::string("\xff\xff\xff", 3), 2), HandshakeStep::Hello),
               std::runtime_error);
  EXPECT_THROW(tgpg::decode_handshake(grpc::ByteBuffer(), HandshakeStep::Hello), std::runtime_error);
}

}  // namespace
}  // namespace tgpg_test
