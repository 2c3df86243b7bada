#include "transport/wire_format.h"

#include <grpcpp/support/slice.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "torch_grpc_pg.pb.h"
#include "transport/protocol.h"

namespace tgpg {
namespace {

static_assert(kProtocolVersion == torch_grpc_pg::PROTOCOL_VERSION_CURRENT,
              "protocol.h and protos/torch_grpc_pg.proto name different protocol versions");

// Protobuf tags of Frame's fields: (field number << 3) | wire type 2 (length-delimited).
constexpr uint8_t kHeaderTag = (1 << 3) | 2;
constexpr uint8_t kPayloadTag = (2 << 3) | 2;
constexpr uint8_t kRingOfferTag = (8 << 3) | 2;
constexpr uint8_t kRingSwitchTag = (9 << 3) | 2;

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

torch_grpc_pg::FrameHeader to_proto(const FrameHeader& h) {
  torch_grpc_pg::FrameHeader p;
  p.set_kind(static_cast<torch_grpc_pg::FrameKind>(h.kind));
  p.set_seq(h.seq);
  p.set_op(h.op);
  p.set_dtype(h.dtype);
  p.set_count(h.count);
  p.set_offset(h.offset);
  p.set_src_rank(h.src_rank);
  p.set_root(h.root);
  p.set_reduction(h.reduction);
  p.set_schedule(h.schedule);
  p.set_tag(h.tag);
  p.set_error(h.error);
  return p;
}

FrameHeader from_proto(const torch_grpc_pg::FrameHeader& p) {
  FrameHeader h;
  switch (p.kind()) {
    case torch_grpc_pg::FRAME_KIND_DATA: h.kind = FrameKind::Data; break;
    case torch_grpc_pg::FRAME_KIND_ABORT: h.kind = FrameKind::Abort; break;
    default: throw std::runtime_error("unknown frame kind " + std::to_string(p.kind()));
  }
  if (p.error().size() > kMaxAbortTextBytes) {
    throw std::runtime_error("abort text of " + std::to_string(p.error().size()) + " bytes exceeds " +
                             std::to_string(kMaxAbortTextBytes));
  }
  h.seq = p.seq();
  h.op = p.op();
  h.dtype = p.dtype();
  h.count = p.count();
  h.offset = p.offset();
  h.src_rank = p.src_rank();
  h.root = p.root();
  h.reduction = p.reduction();
  h.schedule = p.schedule();
  h.tag = p.tag();
  h.error = p.error();
  return h;
}

// Reads the leading bytes of a message spread over slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  uint8_t byte() {
    skip_empty();
    if (index_ == slices_.size()) throw std::runtime_error("frame ends early");
    return slices_[index_].begin()[pos_++];
  }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return value;
    }
    throw std::runtime_error("malformed varint in frame");
  }

  std::string bytes(size_t n) {
    std::string out;
    out.reserve(n);
    while (out.size() < n) {
      skip_empty();
      if (index_ == slices_.size()) throw std::runtime_error("frame header ends early");
      const size_t take = std::min(n - out.size(), slices_[index_].size() - pos_);
      out.append(reinterpret_cast<const char*>(slices_[index_].begin() + pos_), take);
      pos_ += take;
    }
    return out;
  }

  bool at_end() {
    skip_empty();
    return index_ == slices_.size();
  }

  std::vector<ByteView> rest() {
    std::vector<ByteView> views;
    for (; index_ < slices_.size(); ++index_, pos_ = 0) {
      const grpc::Slice& s = slices_[index_];
      if (s.size() > pos_) {
        views.push_back({reinterpret_cast<const std::byte*>(s.begin() + pos_), s.size() - pos_});
      }
    }
    return views;
  }

 private:
  void skip_empty() {
    while (index_ < slices_.size() && pos_ == slices_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t pos_ = 0;
};

struct PayloadRelease {
  std::function<void()> release;
};

void release_payload(void* user_data) {
  std::unique_ptr<PayloadRelease> owned(static_cast<PayloadRelease*>(user_data));
  if (owned->release) owned->release();
}

// Field 1 (the header) and the tag and length of field 2 (the payload), whose
// bytes follow in a slice of their own, if any.
std::string frame_prefix(const torch_grpc_pg::FrameHeader& header, size_t payload_bytes) {
  const std::string header_bytes = header.SerializeAsString();
  std::string prefix;
  prefix.reserve(header_bytes.size() + 24);
  prefix.push_back(static_cast<char>(kHeaderTag));
  append_varint(prefix, header_bytes.size());
  prefix += header_bytes;
  prefix.push_back(static_cast<char>(kPayloadTag));
  append_varint(prefix, payload_bytes);
  return prefix;
}

}  // namespace

std::string encode_frame_prefix(const FrameHeader& header, size_t payload_bytes) {
  return frame_prefix(to_proto(header), payload_bytes);
}

grpc::Slice borrowed_slice(ByteView payload, std::function<void()> release) {
  // gRPC takes ownership of the release hook and calls it when it drops the slice.
  auto hook = std::make_unique<PayloadRelease>(PayloadRelease{std::move(release)});
  return grpc::Slice(const_cast<std::byte*>(payload.data), payload.size, &release_payload, hook.release());
}

grpc::ByteBuffer encode_frame(const FrameHeader& header, ByteView payload,
                              std::function<void()> release) {
  std::vector<grpc::Slice> slices;
  slices.emplace_back(encode_frame_prefix(header, payload.size));
  if (payload.size > 0) {
    slices.push_back(borrowed_slice(payload, std::move(release)));
  } else if (release) {
    release();
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string encode_frame_record(const FrameHeader& header, ByteView payload) {
  std::string record = frame_prefix(to_proto(header), payload.size);
  if (payload.size > 0) record.append(reinterpret_cast<const char*>(payload.data), payload.size);
  return record;
}

std::string encode_ring_frame(const FrameHeader& header, const RingSlot& slot) {
  torch_grpc_pg::FrameHeader proto = to_proto(header);
  auto* ring_slot = proto.mutable_ring_slot();
  ring_slot->set_index(slot.index);
  ring_slot->set_seq(slot.seq);
  ring_slot->set_bytes(slot.bytes);
  return frame_prefix(proto, 0);
}

grpc::ByteBuffer encode_ring_switch() {
  torch_grpc_pg::Frame frame;
  frame.mutable_ring_switch();
  grpc::Slice only(frame.SerializeAsString());
  return grpc::ByteBuffer(&only, 1);
}

grpc::ByteBuffer encode_ring_offer(const RingOffer& offer) {
  torch_grpc_pg::Frame frame;
  auto* proto = frame.mutable_ring_offer();
  proto->set_pid(offer.pid);
  proto->set_fd(offer.fd);
  proto->set_slots(offer.slots);
  proto->set_slot_bytes(offer.slot_bytes);
  proto->set_token(offer.token);
  grpc::Slice only(frame.SerializeAsString());
  return grpc::ByteBuffer(&only, 1);
}

DecodedMessage decode_message(grpc::ByteBuffer&& buffer, size_t max_payload_bytes) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Dump(slices.get()).ok()) throw std::runtime_error("unreadable frame");
  SliceReader reader(*slices);
  const uint8_t first_tag = reader.byte();
  if (first_tag != kHeaderTag && first_tag != kRingOfferTag && first_tag != kRingSwitchTag) {
    throw std::runtime_error("frame does not start with a header");
  }
  const uint64_t header_size = reader.varint();
  if (header_size > kMaxHeaderBytes) {
    throw std::runtime_error("frame header of " + std::to_string(header_size) + " bytes exceeds " +
                             std::to_string(kMaxHeaderBytes));
  }
  const std::string header_bytes = reader.bytes(header_size);
  DecodedMessage message;
  if (first_tag == kRingSwitchTag) {
    if (header_size != 0 || !reader.at_end()) throw std::runtime_error("a ring switch carries something");
    message.ring_switch = true;
    return message;
  }
  if (first_tag == kRingOfferTag) {
    torch_grpc_pg::RingOffer proto;
    if (!proto.ParseFromString(header_bytes)) throw std::runtime_error("malformed ring offer");
    if (!reader.at_end()) throw std::runtime_error("a ring offer carries something else too");
    message.ring_offer = RingOffer{proto.pid(), proto.fd(), proto.slots(), proto.slot_bytes(), proto.token()};
    return message;
  }
  torch_grpc_pg::FrameHeader proto;
  if (!proto.ParseFromString(header_bytes)) throw std::runtime_error("malformed frame header");

  ReceivedFrame& frame = message.frame;
  frame.header = from_proto(proto);
  // proto3 encoders leave out an empty payload field; ours always writes it.
  if (!reader.at_end()) {
    if (reader.byte() != kPayloadTag) throw std::runtime_error("frame has no payload field");
    const uint64_t payload_size = reader.varint();
    if (payload_size > max_payload_bytes) {
      throw std::runtime_error("frame payload of " + std::to_string(payload_size) + " bytes exceeds the " +
                               std::to_string(max_payload_bytes) + " bytes of a chunk");
    }
    frame.payload = reader.rest();
    if (frame.payload_bytes() != payload_size) throw std::runtime_error("frame payload is truncated");
  }
  if (proto.has_ring_slot()) {
    const auto& slot = proto.ring_slot();
    if (frame.header.kind != FrameKind::Data || !frame.payload.empty()) {
      throw std::runtime_error("a frame names a ring slot and carries a payload or an abort too");
    }
    if (slot.bytes() > max_payload_bytes) {
      throw std::runtime_error("ring slot payload of " + std::to_string(slot.bytes()) + " bytes exceeds the " +
                               std::to_string(max_payload_bytes) + " bytes of a chunk");
    }
    message.ring_slot = RingSlot{slot.index(), slot.seq(), slot.bytes()};
  }
  frame.owner = std::move(slices);
  return message;
}

DecodedMessage decode_record(const std::string& record, size_t max_payload_bytes) {
  grpc::Slice only(record);
  return decode_message(grpc::ByteBuffer(&only, 1), max_payload_bytes);
}

ReceivedFrame decode_frame(grpc::ByteBuffer&& buffer, size_t max_payload_bytes) {
  DecodedMessage message = decode_message(std::move(buffer), max_payload_bytes);
  if (message.ring_offer || message.ring_slot || message.ring_switch) {
    throw std::runtime_error("a shared-ring message where a frame was expected");
  }
  return std::move(message.frame);
}

}  // namespace tgpg
