#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <functional>

#include "algorithms/frame.h"

namespace tgpg {

// Bounds on what a received data frame may hold, checked before anything is
// copied out of gRPC's buffers. gRPC itself refuses messages over the
// server's receive limit (payload limit + kMaxHeaderBytes).
constexpr size_t kMaxHeaderBytes = 8 << 10;
constexpr size_t kMaxAbortTextBytes = 4 << 10;

// A Frame message (protos/torch_grpc_pg.proto) made of two slices: a small one
// holding the protobuf encoding of the header and of the payload's length
// prefix, and one that points at the payload where it lies. `release` runs
// once the transport no longer needs the payload memory.
grpc::ByteBuffer encode_frame(const FrameHeader& header, ByteView payload,
                              std::function<void()> release);

// Parses a received data Frame without copying the payload: the returned
// views point into the buffer's slices, which the frame keeps alive. Throws
// std::runtime_error on anything but a well-formed data or abort frame with
// at most `max_payload_bytes` of payload.
ReceivedFrame decode_frame(grpc::ByteBuffer&& buffer, size_t max_payload_bytes);

}  // namespace tgpg
