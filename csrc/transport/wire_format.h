#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "algorithms/frame.h"
#include "same_host/shared_ring.h"

namespace tgpg {

// Bounds on what a received data frame may hold, checked before anything is
// copied out of gRPC's buffers. gRPC itself refuses messages over the
// server's receive limit (payload limit + kMaxHeaderBytes).
constexpr size_t kMaxHeaderBytes = 8 << 10;
constexpr size_t kMaxAbortTextBytes = 4 << 10;

// The bytes of a Frame's encoding that come before its payload: the header,
// and the payload's tag and length.
std::string encode_frame_prefix(const FrameHeader& header, size_t payload_bytes);

// A slice that points at `payload` where it lies; gRPC runs `release` once it
// drops the slice.
grpc::Slice borrowed_slice(ByteView payload, std::function<void()> release);

// A Frame message (protos/torch_grpc_pg.proto) made of two slices: a small one
// holding the protobuf encoding of the header and of the payload's length
// prefix, and one that points at the payload where it lies. `release` runs
// once the transport no longer needs the payload memory.
grpc::ByteBuffer encode_frame(const FrameHeader& header, ByteView payload,
                              std::function<void()> release);

// The same Frame as encode_frame, as bytes, for a record of the shared ring.
std::string encode_frame_record(const FrameHeader& header, ByteView payload);

// A data frame whose payload lies in slot `slot` of the sender's shared ring,
// for a record of that ring.
std::string encode_ring_frame(const FrameHeader& header, const RingSlot& slot);

// A Frame holding only the sender's ring offer.
grpc::ByteBuffer encode_ring_offer(const RingOffer& offer);

// A Frame holding only the switch: the sender's later frames are in its ring's records.
grpc::ByteBuffer encode_ring_switch();

// What an open Exchange stream may carry: a frame (whose payload may lie in
// the sender's ring instead of in the message), the sender's ring offer, or
// its switch to the ring's records.
struct DecodedMessage {
  ReceivedFrame frame;                  // unless this is a ring offer or switch
  std::optional<RingSlot> ring_slot;    // the frame's payload is there, not in `frame`
  std::optional<RingOffer> ring_offer;  // the message is this, and nothing else
  bool ring_switch = false;             // the message is this, and nothing else
};

// Parses a received message without copying the payload: the returned views
// point into the buffer's slices, which the frame keeps alive. Throws
// std::runtime_error on anything but a well-formed data or abort frame with
// at most `max_payload_bytes` of payload (inline or in a ring slot), or a ring
// offer.
DecodedMessage decode_message(grpc::ByteBuffer&& buffer, size_t max_payload_bytes);

// decode_message for a record taken from a shared ring.
DecodedMessage decode_record(const std::string& record, size_t max_payload_bytes);

// decode_message for callers that take only frames with their payload inline.
ReceivedFrame decode_frame(grpc::ByteBuffer&& buffer, size_t max_payload_bytes);

}  // namespace tgpg
