#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <functional>

#include "algorithms/frame.h"

namespace tgpg {

// A Frame message (protos/torch_grpc_pg.proto) made of two slices: a small one
// holding the protobuf encoding of the header and of the payload's length
// prefix, and one that points at the payload where it lies. `release` runs
// once the transport no longer needs the payload memory.
grpc::ByteBuffer encode_frame(const FrameHeader& header, ByteView payload,
                              std::function<void()> release);

// Parses a received Frame without copying the payload: the returned views
// point into the buffer's slices, which the frame keeps alive.
// Throws std::runtime_error on a malformed frame.
ReceivedFrame decode_frame(grpc::ByteBuffer&& buffer);

}  // namespace tgpg
