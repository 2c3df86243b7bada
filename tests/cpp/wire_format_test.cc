// encode_frame / decode_frame: round trips, agreement with protobuf's own
// encoding of the Frame message, and malformed input from the network.

#include <gtest/gtest.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "allocation_probe.h"
#include "torch_grpc_pg.pb.h"
#include "transport/wire_format.h"

namespace tgpg_test {
namespace {

tgpg::FrameHeader sample_header() {
  tgpg::FrameHeader h;
  h.kind = tgpg::FrameKind::Data;
  h.seq = (uint64_t{1} << 40) + 3;  // wider than 32 bits, so that truncation shows
  h.op = 9;
  h.dtype = 4;
  h.count = 123456789012ULL;
  h.offset = 77;
  h.src_rank = 5;
  h.root = 3;
  h.reduction = 64;
  return h;
}

void expect_same_header(const tgpg::FrameHeader& got, const tgpg::FrameHeader& want) {
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.seq, want.seq);
  EXPECT_EQ(got.op, want.op);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.offset, want.offset);
  EXPECT_EQ(got.src_rank, want.src_rank);
  EXPECT_EQ(got.root, want.root);
  EXPECT_EQ(got.reduction, want.reduction);
  EXPECT_EQ(got.error, want.error);
}

std::string payload_of(const tgpg::ReceivedFrame& frame) {
  std::string out(frame.payload_bytes(), '\0');
  frame.copy_payload_to(out.data());
  return out;
}

// The bytes of a message as one string.
std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a message of copied slices, cut at the given offsets.
grpc::ByteBuffer slices_of(const std::string& bytes, const std::vector<size_t>& cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + begin, cut - begin);
    begin = cut;
  }
  slices.emplace_back(bytes.data() + begin, bytes.size() - begin);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Larger than any payload below, unless a test says otherwise.
constexpr size_t kPayloadLimit = 1 << 20;

tgpg::ReceivedFrame decode(const std::string& bytes, const std::vector<size_t>& cuts = {},
                           size_t max_payload_bytes = kPayloadLimit) {
  return tgpg::decode_frame(slices_of(bytes, cuts), max_payload_bytes);
}

std::string encoded(const tgpg::FrameHeader& header, const std::string& payload) {
  grpc::ByteBuffer buffer = tgpg::encode_frame(
      header, {reinterpret_cast<const std::byte*>(payload.data()), payload.size()}, nullptr);
  return flatten(buffer);
}

std::string varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

TEST(WireFormat, RoundTripsEveryHeaderField) {
  const std::string payload = "0123456789abcdef";
  const tgpg::ReceivedFrame frame = decode(encoded(sample_header(), payload));
  expect_same_header(frame.header, sample_header());
  EXPECT_EQ(payload_of(frame), payload);

  tgpg::FrameHeader abort;
  abort.kind = tgpg::FrameKind::Abort;
  abort.src_rank = 2;
  abort.error = std::string("rank 2 failed: ") + std::string(300, 'x');
  expect_same_header(decode(encoded(abort, "")).header, abort);
}

TEST(WireFormat, PayloadIsNeitherCopiedOnEncodeNorOnDecode) {
  std::vector<std::byte> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 13);
  const tgpg::ReceivedFrame frame =
      tgpg::decode_frame(tgpg::encode_frame(sample_header(), {payload.data(), payload.size()}, nullptr), kPayloadLimit);
  ASSERT_EQ(frame.payload_bytes(), payload.size());
  for (const auto& view : frame.payload) {
    EXPECT_GE(view.data, payload.data());
    EXPECT_LE(view.data + view.size, payload.data() + payload.size()) << "a payload view points at a copy";
  }
}

// gRPC hands over a message in slices cut wherever it likes: inside the tag,
// inside a varint, inside the header or the payload.
TEST(WireFormat, DecodesMessagesCutAnywhere) {
  const std::string payload = "the payload, 33 bytes long ......";
  const std::string bytes = encoded(sample_header(), payload);
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    const tgpg::ReceivedFrame frame = decode(bytes, {cut});
    expect_same_header(frame.header, sample_header());
    ASSERT_EQ(payload_of(frame), payload) << "cut at " << cut;
  }
  for (size_t step = 1; step <= 7; ++step) {
    std::vector<size_t> cuts;
    for (size_t at = step; at < bytes.size(); at += step) cuts.push_back(at);
    const tgpg::ReceivedFrame frame = decode(bytes, cuts);
    expect_same_header(frame.header, sample_header());
    ASSERT_EQ(payload_of(frame), payload) << "cut every " << step << " bytes";
  }
}

TEST(WireFormat, EmptyPayload) {
  int released = 0;
  std::string bytes;
  {
    grpc::ByteBuffer buffer = tgpg::encode_frame(sample_header(), {}, [&] { ++released; });
    bytes = flatten(buffer);
    const tgpg::ReceivedFrame frame = tgpg::decode_frame(std::move(buffer), kPayloadLimit);
    expect_same_header(frame.header, sample_header());
    EXPECT_TRUE(frame.payload.empty());
    EXPECT_EQ(frame.payload_bytes(), 0u);
  }
  EXPECT_EQ(released, 1);
  // proto3 encoders leave an empty payload out altogether.
  torch_grpc_pg::Frame message;
  message.mutable_header()->set_seq(4);
  const tgpg::ReceivedFrame frame = decode(message.SerializeAsString());
  EXPECT_EQ(frame.header.seq, 4u);
  EXPECT_EQ(frame.payload_bytes(), 0u);
}

// The payload must stay untouched until the transport lets go of it, which is
// after the last holder of the message or of a frame decoded from it.
TEST(WireFormat, ReleaseRunsOnceAfterTheLastHolder) {
  std::string payload(64, 'p');
  const tgpg::ByteView view{reinterpret_cast<const std::byte*>(payload.data()), payload.size()};
  int released = 0;
  { grpc::ByteBuffer buffer = tgpg::encode_frame(sample_header(), view, [&] { ++released; }); }
  EXPECT_EQ(released, 1);

  released = 0;
  auto frame = std::make_unique<tgpg::ReceivedFrame>();
  {
    grpc::ByteBuffer buffer = tgpg::encode_frame(sample_header(), view, [&] { ++released; });
    grpc::ByteBuffer copy = buffer;
    *frame = tgpg::decode_frame(std::move(buffer), kPayloadLimit);
  }
  EXPECT_EQ(released, 0) << "released while a decoded frame still points at the payload";
  frame.reset();
  EXPECT_EQ(released, 1);
}

// Anything that speaks protobuf must be able to read and write frames.
TEST(WireFormat, AgreesWithProtobuf) {
  const std::string payload(100, 'q');
  torch_grpc_pg::Frame parsed;
  ASSERT_TRUE(parsed.ParseFromString(encoded(sample_header(), payload)));
  const tgpg::FrameHeader h = sample_header();
  EXPECT_EQ(parsed.header().seq(), h.seq);
  EXPECT_EQ(parsed.header().op(), h.op);
  EXPECT_EQ(parsed.header().dtype(), h.dtype);
  EXPECT_EQ(parsed.header().count(), h.count);
  EXPECT_EQ(parsed.header().offset(), h.offset);
  EXPECT_EQ(parsed.header().src_rank(), h.src_rank);
  EXPECT_EQ(parsed.header().root(), h.root);
  EXPECT_EQ(parsed.header().reduction(), h.reduction);
  EXPECT_EQ(parsed.payload(), payload);

  torch_grpc_pg::Frame message;
  auto* header = message.mutable_header();
  header->set_kind(torch_grpc_pg::FRAME_KIND_ABORT);
  header->set_seq(h.seq);
  header->set_op(h.op);
  header->set_dtype(h.dtype);
  header->set_count(h.count);
  header->set_offset(h.offset);
  header->set_src_rank(h.src_rank);
  header->set_root(h.root);
  header->set_reduction(h.reduction);
  header->set_error("why");
  message.set_payload(payload);
  const tgpg::ReceivedFrame frame = decode(message.SerializeAsString(), {3, 50});
  tgpg::FrameHeader want = h;
  want.kind = tgpg::FrameKind::Abort;
  want.error = "why";
  expect_same_header(frame.header, want);
  EXPECT_EQ(payload_of(frame), payload);
}

TEST(WireFormat, RejectsTruncatedMessages) {
  const std::string bytes = encoded(sample_header(), "some payload");
  const size_t header_end = bytes.size() - std::string("some payload").size() - 2;
  for (size_t size = 0; size < bytes.size(); ++size) {
    // A message that ends right after the header is a frame without payload,
    // which is what protobuf makes of an empty one.
    if (size == header_end) continue;
    EXPECT_THROW(decode(bytes.substr(0, size)), std::runtime_error) << "cut to " << size << " bytes";
  }
}

TEST(WireFormat, RejectsBadTagsAndTrailingBytes) {
  const std::string good = encoded(sample_header(), "abc");
  std::string wrong_first = good;
  wrong_first[0] = 0x1a;  // field 3 (a handshake Hello) where the header belongs
  EXPECT_THROW(decode(wrong_first), std::runtime_error);
  std::string wrong_second = good;
  wrong_second[good.size() - 5] = 0x22;  // field 4 where the payload belongs
  EXPECT_THROW(decode(wrong_second), std::runtime_error);
  EXPECT_THROW(decode(good + "x"), std::runtime_error);
  EXPECT_THROW(decode(good.substr(0, good.size() - 4) + '\x04' + "abc"), std::runtime_error);
  EXPECT_THROW(decode(good.substr(0, good.size() - 4) + '\x02' + "abc"), std::runtime_error);
  EXPECT_THROW(decode(std::string("\x0a\x02\xff\xff", 4)), std::runtime_error) << "header that protobuf rejects";
  EXPECT_THROW(tgpg::decode_frame(grpc::ByteBuffer(), kPayloadLimit), std::runtime_error) << "no message at all";
  EXPECT_THROW(decode(""), std::runtime_error);
}

// Between ranks on one host the payload may lie in the sender's shared ring:
// the frame then names a slot, and carries no payload of its own.
TEST(WireFormat, RingFramesAndOffersRoundTrip) {
  const tgpg::RingSlot slot{5, 123456789, 2 << 20};
  const std::string ring_frame_bytes = tgpg::encode_ring_frame(sample_header(), slot);
  tgpg::DecodedMessage message = tgpg::decode_record(ring_frame_bytes, 2 << 20);
  expect_same_header(message.frame.header, sample_header());
  EXPECT_TRUE(message.frame.payload.empty());
  ASSERT_TRUE(message.ring_slot);
  EXPECT_EQ(message.ring_slot->index, slot.index);
  EXPECT_EQ(message.ring_slot->seq, slot.seq);
  EXPECT_EQ(message.ring_slot->bytes, slot.bytes);
  EXPECT_FALSE(message.ring_offer);
  EXPECT_THROW(tgpg::decode_message(slices_of(ring_frame_bytes), (2 << 20) - 1), std::runtime_error)
      << "a slot holding more than a chunk";
  EXPECT_THROW(decode(ring_frame_bytes, {}, 2 << 20), std::runtime_error) << "decode_frame takes inline payloads only";

  const tgpg::RingOffer offer{4242, 17, 8, 2 << 20, std::string(32, 't')};
  message = tgpg::decode_message(tgpg::encode_ring_offer(offer), kPayloadLimit);
  ASSERT_TRUE(message.ring_offer);
  EXPECT_FALSE(message.ring_slot);
  EXPECT_EQ(message.ring_offer->pid, offer.pid);
  EXPECT_EQ(message.ring_offer->fd, offer.fd);
  EXPECT_EQ(message.ring_offer->slots, offer.slots);
  EXPECT_EQ(message.ring_offer->slot_bytes, offer.slot_bytes);
  EXPECT_EQ(message.ring_offer->token, offer.token);

  // A plain frame names no slot and offers nothing.
  message = tgpg::decode_message(slices_of(encoded(sample_header(), "abc")), kPayloadLimit);
  EXPECT_FALSE(message.ring_slot);
  EXPECT_FALSE(message.ring_offer);
  EXPECT_FALSE(message.ring_switch);

  // The switch is a message of its own, with nothing in it.
  message = tgpg::decode_message(tgpg::encode_ring_switch(), kPayloadLimit);
  EXPECT_TRUE(message.ring_switch);
  EXPECT_FALSE(message.ring_offer);
  EXPECT_FALSE(message.ring_slot);
  torch_grpc_pg::Frame full_switch;
  full_switch.mutable_ring_switch();
  EXPECT_EQ(flatten(tgpg::encode_ring_switch()), full_switch.SerializeAsString());
  EXPECT_THROW(tgpg::decode_message(slices_of(std::string("\x4a\x01\x00", 3)), kPayloadLimit), std::runtime_error)
      << "a switch that carries something";
  EXPECT_THROW(decode(flatten(tgpg::encode_ring_switch())), std::runtime_error)
      << "decode_frame takes frames only";
}

// A record of the shared ring holds the bytes a frame has on the stream.
TEST(WireFormat, RecordsHoldTheStreamEncoding) {
  const std::string abc = "abc";
  const std::string record =
      tgpg::encode_frame_record(sample_header(), {reinterpret_cast<const std::byte*>(abc.data()), abc.size()});
  EXPECT_EQ(record, encoded(sample_header(), "abc"));
  tgpg::DecodedMessage message = tgpg::decode_record(record, kPayloadLimit);
  expect_same_header(message.frame.header, sample_header());
  std::string payload(message.frame.payload_bytes(), '\0');
  message.frame.copy_payload_to(payload.data());
  EXPECT_EQ(payload, "abc");
  EXPECT_EQ(tgpg::encode_frame_record(sample_header(), {}), encoded(sample_header(), ""));
}

TEST(WireFormat, RejectsRingFramesThatCarryMoreThanTheirSlot) {
  torch_grpc_pg::Frame both;
  both.mutable_header()->mutable_ring_slot()->set_bytes(3);
  both.set_payload("abc");
  EXPECT_THROW(tgpg::decode_message(slices_of(both.SerializeAsString()), kPayloadLimit), std::runtime_error)
      << "a slot and an inline payload";

  torch_grpc_pg::Frame abort;
  abort.mutable_header()->set_kind(torch_grpc_pg::FRAME_KIND_ABORT);
  abort.mutable_header()->mutable_ring_slot()->set_bytes(3);
  EXPECT_THROW(tgpg::decode_message(slices_of(abort.SerializeAsString()), kPayloadLimit), std::runtime_error)
      << "an abort with a slot";

  torch_grpc_pg::Frame offer_and_more;
  offer_and_more.mutable_ring_offer()->set_slots(1);
  const std::string trailing = offer_and_more.SerializeAsString() + encoded(sample_header(), "x");
  EXPECT_THROW(tgpg::decode_message(slices_of(trailing), kPayloadLimit), std::runtime_error)
      << "an offer followed by a frame";
}

TEST(WireFormat, RejectsOverlongVarints) {
  // Eleven continuation bytes: longer than any 64-bit varint.
  EXPECT_THROW(decode(std::string("\x0a") + std::string(11, '\x80') + '\x01'), std::runtime_error);
  const std::string header = torch_grpc_pg::FrameHeader().SerializeAsString();
  EXPECT_THROW(decode(std::string("\x0a") + varint(header.size()) + header + '\x12' + std::string(11, '\xff')),
               std::runtime_error);
}

// Lengths that no frame can have must be refused as malformed, like any other
// malformed input, and not surface as some other exception type.
TEST(WireFormat, RejectsImpossibleLengths) {
  for (uint64_t length : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{1} << 62}) {
    EXPECT_THROW(decode(std::string("\x0a") + varint(length) + "abc"), std::runtime_error) << "header length " << length;
    const std::string header = torch_grpc_pg::FrameHeader().SerializeAsString();
    EXPECT_THROW(decode(std::string("\x0a") + varint(header.size()) + header + '\x12' + varint(length) + "abc"),
                 std::runtime_error)
        << "payload length " << length;
  }
}

// A few bytes from the network must not make the receiver allocate what their
// length fields claim before it has seen that many bytes.
TEST(WireFormat, ClaimedLengthsDoNotDriveAllocation) {
  const std::string message = std::string("\x0a") + varint(uint64_t{64} << 20) + "abc";
  AllocationProbe probe;
  EXPECT_THROW(decode(message), std::runtime_error);
  EXPECT_LT(probe.largest(), size_t{1} << 20) << "a " << message.size()
                                              << "-byte message made the decoder allocate this many bytes at once";
}

TEST(WireFormat, PayloadLimit) {
  const std::string payload(64, 'z');
  EXPECT_EQ(payload_of(decode(encoded(sample_header(), payload), {}, 64)), payload);
  EXPECT_THROW(decode(encoded(sample_header(), payload + "z"), {}, 64), std::runtime_error);
  // The claimed length alone decides, before any payload byte is looked at.
  const std::string claim = encoded(sample_header(), "");
  EXPECT_THROW(decode(claim + '\x12' + varint(65), {}, 64), std::runtime_error);
}

// A header of `size` bytes that protobuf accepts: the bulk is an unknown field.
std::string header_of_size(size_t size) {
  std::string bytes = std::string("\x7a") + varint(size - 3);  // field 15, length-delimited
  bytes += std::string(size - 3, 'u');
  return std::string("\x0a") + varint(bytes.size()) + bytes;
}

TEST(WireFormat, HeaderLimit) {
  EXPECT_EQ(decode(header_of_size(tgpg::kMaxHeaderBytes)).payload_bytes(), 0u);
  EXPECT_THROW(decode(header_of_size(tgpg::kMaxHeaderBytes + 1)), std::runtime_error);
}

TEST(WireFormat, AbortTextLimit) {
  tgpg::FrameHeader abort;
  abort.kind = tgpg::FrameKind::Abort;
  abort.error = std::string(tgpg::kMaxAbortTextBytes, 'e');
  EXPECT_EQ(decode(encoded(abort, "")).header.error, abort.error);
  abort.error += 'e';
  EXPECT_THROW(decode(encoded(abort, "")), std::runtime_error);
}

// Abort reasons are exception texts, cut to kMaxAbortTextBytes by byte count,
// so they need not be valid UTF-8. The peer must still read the abort;
// otherwise it reports an unreadable frame instead of the reason.
TEST(WireFormat, AbortTextNeedNotBeUtf8) {
  const std::string cut_inside_a_character = std::string(tgpg::kMaxAbortTextBytes - 1, 'a') + "\xc3";
  const std::string latin1 = "cannot open /data/caf\xe9/shard-3";
  for (const std::string& text : {cut_inside_a_character, latin1}) {
    tgpg::FrameHeader abort;
    abort.kind = tgpg::FrameKind::Abort;
    abort.src_rank = 1;
    abort.error = text;
    tgpg::ReceivedFrame frame;
    try {
      frame = decode(encoded(abort, ""));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "an abort whose text is not UTF-8 was refused: " << e.what();
      continue;
    }
    EXPECT_EQ(frame.header.kind, tgpg::FrameKind::Abort);
    EXPECT_EQ(frame.header.src_rank, 1u);
    // The text may be repaired, but what was readable must survive.
    EXPECT_EQ(frame.header.error.substr(0, 20), text.substr(0, 20));
  }
}

TEST(WireFormat, RejectsUnknownFrameKinds) {
  torch_grpc_pg::Frame message;
  message.mutable_header()->set_kind(static_cast<torch_grpc_pg::FrameKind>(7));
  EXPECT_THROW(decode(message.SerializeAsString()), std::runtime_error);
}

}  // namespace
}  // namespace tgpg_test
