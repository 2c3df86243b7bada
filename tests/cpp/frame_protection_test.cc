// FrameSealer and FrameOpener: what one end of a link seals, the other opens,
// in whatever slices gRPC cuts it into; and every message altered, dropped,
// replayed or reordered on the way, sealed with another key, or of another
// protection, is refused.

#include <gtest/gtest.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <string>
#include <vector>

#include "transport/frame_protection.h"
#include "transport/wire_format.h"

namespace tgpg_test {
namespace {

using tgpg::FrameAuthenticationError;
using tgpg::FrameOpener;
using tgpg::FrameSealer;
using tgpg::Protection;

const std::string kKey(32, '\x21');
constexpr size_t kMaxFrame = (1 << 20) + 8192 + 64;

std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a received message, cut every `step` bytes.
grpc::ByteBuffer sliced(const std::string& bytes, size_t step) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += step) {
    slices.emplace_back(bytes.data() + at, std::min(step, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

tgpg::FrameHeader header_of(uint64_t seq, size_t bytes) {
  tgpg::FrameHeader h;
  h.seq = seq;
  h.op = 1;
  h.dtype = 1;
  h.count = bytes / 4;
  h.src_rank = 1;
  return h;
}

std::string payload_of(size_t bytes, char seed) {
  std::string p(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<char>(seed + 31 * i);
  return p;
}

// The message sealing frame `seq` with `payload` would be, as bytes.
std::string sealed(FrameSealer& sealer, uint64_t seq, const std::string& payload) {
  const tgpg::ByteView view{reinterpret_cast<const std::byte*>(payload.data()), payload.size()};
  return flatten(sealer.seal(tgpg::encode_frame_prefix(header_of(seq, payload.size()), payload.size()), view, nullptr));
}

class Protected : public ::testing::TestWithParam<Protection> {};

TEST_P(Protected, WhatIsSealedOpensInAnySlicing) {
  FrameSealer sealer(GetParam(), kKey);
  FrameOpener opener(GetParam(), kKey, kMaxFrame);
  uint64_t seq = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 20}) {
    for (size_t step : {size_t{1} << 30, size_t{7}, size_t{4096}}) {
      if (step == 7 && bytes > 1000) continue;  // a million slices: slow, and nothing new
      const std::string payload = payload_of(bytes, static_cast<char>(seq));
      const std::string message = sealed(sealer, ++seq, payload);
      const tgpg::ReceivedFrame frame = tgpg::decode_frame(opener.open(sliced(message, step)), kMaxFrame);
      EXPECT_EQ(frame.header.seq, seq);
      ASSERT_EQ(frame.payload_bytes(), bytes);
      std::string got(bytes, '\0');
      frame.copy_payload_to(got.data());
      EXPECT_EQ(got, payload) << bytes << " bytes in slices of " << step;
    }
  }
  EXPECT_EQ(opener.opened(), seq);
}

TEST_P(Protected, EveryByteOfAMessageIsCovered) {
  FrameSealer sealer(GetParam(), kKey);
  const std::string payload = payload_of(300, 'a');
  const std::string message = sealed(sealer, 1, payload);
  for (size_t at = 0; at < message.size(); ++at) {
    FrameOpener opener(GetParam(), kKey, kMaxFrame);
    std::string altered = message;
    altered[at] ^= 0x01;
    // Bytes of the outer length fail as a malformed message, the rest their tag.
    EXPECT_THROW(opener.open(sliced(altered, 1 << 30)), std::runtime_error) << "byte " << at;
  }
}

TEST_P(Protected, ADroppedReplayedOrReorderedMessageFails) {
  FrameSealer sealer(GetParam(), kKey);
  const std::string payload = payload_of(64, 'z');
  const std::string first = sealed(sealer, 1, payload), second = sealed(sealer, 2, payload);
  {
    FrameOpener opener(GetParam(), kKey, kMaxFrame);  // the first was dropped
    EXPECT_THROW(opener.open(sliced(second, 1 << 30)), FrameAuthenticationError);
  }
  {
    FrameOpener opener(GetParam(), kKey, kMaxFrame);  // the first, replayed
    opener.open(sliced(first, 1 << 30));
    EXPECT_THROW(opener.open(sliced(first, 1 << 30)), FrameAuthenticationError);
  }
  {
    FrameOpener opener(GetParam(), std::string(32, '\x22'), kMaxFrame);  // another key
    EXPECT_THROW(opener.open(sliced(first, 1 << 30)), FrameAuthenticationError);
  }
}

TEST_P(Protected, AMessageOverTheBoundIsRefusedBeforeItIsRead) {
  FrameSealer sealer(GetParam(), kKey);
  FrameOpener opener(GetParam(), kKey, 1000);
  EXPECT_THROW(
      {
        try {
          opener.open(sliced(sealed(sealer, 1, payload_of(2000, 'b')), 1 << 30));
        } catch (const FrameAuthenticationError&) {
          ADD_FAILURE() << "checked the tag of a message it should have refused unread";
        }
      },
      std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(Both, Protected, ::testing::Values(Protection::Aead, Protection::Mac),
                         [](const auto& info) { return info.param == Protection::Aead ? "Aead" : "Mac"; });

TEST(FrameProtection, EncryptedPayloadsLeaveNoTraceAndAreReleasedAtOnce) {
  FrameSealer sealer(Protection::Aead, kKey);
  const std::string payload(4096, 'Q');
  bool released = false;
  const tgpg::ByteView view{reinterpret_cast<const std::byte*>(payload.data()), payload.size()};
  const std::string message = flatten(
      sealer.seal(tgpg::encode_frame_prefix(header_of(1, 4096), 4096), view, [&] { released = true; }));
  EXPECT_TRUE(released);  // the message holds ciphertext, not the tensor
  EXPECT_EQ(message.find(std::string(64, 'Q')), std::string::npos);
}

TEST(FrameProtection, SignedPayloadsAreSentFromWhereTheyLie) {
  FrameSealer sealer(Protection::Mac, kKey);
  const std::string payload(4096, 'Q');
  bool released = false;
  const tgpg::ByteView view{reinterpret_cast<const std::byte*>(payload.data()), payload.size()};
  {
    grpc::ByteBuffer message =
        sealer.seal(tgpg::encode_frame_prefix(header_of(1, 4096), 4096), view, [&] { released = true; });
    EXPECT_FALSE(released);  // gRPC still holds the payload
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    bool borrowed = false;
    for (const auto& s : slices) borrowed = borrowed || s.begin() == reinterpret_cast<const uint8_t*>(payload.data());
    EXPECT_TRUE(borrowed);
  }
  EXPECT_TRUE(released);
}

TEST(FrameProtection, AMessageOfTheOtherProtectionOrNoneIsRefused) {
  FrameSealer aead(Protection::Aead, kKey), mac(Protection::Mac, kKey);
  const std::string payload = payload_of(100, 'c');
  FrameOpener expects_mac(Protection::Mac, kKey, kMaxFrame), expects_aead(Protection::Aead, kKey, kMaxFrame);
  EXPECT_THROW(expects_mac.open(sliced(sealed(aead, 1, payload), 1 << 30)), std::runtime_error);
  EXPECT_THROW(expects_aead.open(sliced(sealed(mac, 1, payload), 1 << 30)), std::runtime_error);
  const tgpg::ByteView view{reinterpret_cast<const std::byte*>(payload.data()), payload.size()};
  const std::string plain = flatten(tgpg::encode_frame(header_of(1, 100), view, nullptr));
  FrameOpener fresh(Protection::Aead, kKey, kMaxFrame);
  EXPECT_THROW(fresh.open(sliced(plain, 1 << 30)), std::runtime_error);
  EXPECT_THROW(fresh.open(grpc::ByteBuffer()), std::runtime_error);
}

}  // namespace
}  // namespace tgpg_test
