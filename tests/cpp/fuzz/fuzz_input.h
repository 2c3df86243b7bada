#pragma once

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tgpg_fuzz {

// The layout of a fuzz input, shared by the targets and the seed generator:
//   byte 0         bits 0-1: the message comes in 1 + (bits) slices;
//                  bits 2-7: left to the target (e.g. which handshake step)
//   next k-1 bytes the sizes of all slices but the last (k = slice count)
//   the rest       the message, the last slice taking what is left
// so that the fuzzer explores where gRPC cuts a message as well as its bytes.
inline size_t slice_count(uint8_t control) { return 1 + (control & 3); }

// Returns false when the input is too short to hold its own layout.
inline bool to_message(const uint8_t* data, size_t size, grpc::ByteBuffer* out) {
  if (size < 1) return false;
  const size_t slices = slice_count(data[0]);
  if (size < slices) return false;
  const uint8_t* message = data + slices;
  const size_t length = size - slices;
  std::vector<grpc::Slice> pieces;
  size_t at = 0;
  for (size_t i = 0; i + 1 < slices; ++i) {
    const size_t piece = std::min<size_t>(data[1 + i], length - at);
    pieces.emplace_back(message + at, piece);  // copies, like a receive buffer of its own
    at += piece;
  }
  pieces.emplace_back(message + at, length - at);
  *out = grpc::ByteBuffer(pieces.data(), pieces.size());
  return true;
}

// The link key of the sealed seeds and of the target that opens them.
inline const std::string kSeedKey(32, '\x5c');

// The message's bytes in one piece.
inline std::string flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// protobuf logs an error for every string field with invalid UTF-8 that it
// refuses; over a fuzz run that noise buries the fuzzer's own report.
inline void silence_protobuf_log() { google::protobuf::SetLogHandler(nullptr); }

// The control bytes that cut `message` into slices of the given sizes (the
// last slice takes the rest).
inline std::vector<uint8_t> layout(const std::vector<uint8_t>& cuts, uint8_t target_bits) {
  std::vector<uint8_t> out;
  out.push_back(static_cast<uint8_t>((target_bits << 2) | (cuts.size() & 3)));
  out.insert(out.end(), cuts.begin(), cuts.end());
  return out;
}

}  // namespace tgpg_fuzz
