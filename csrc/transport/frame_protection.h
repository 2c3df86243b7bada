#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "algorithms/frame.h"
#include "transport/auth.h"

namespace tgpg {

// Every message a caller writes on a link whose handshake derived keys
// (PROTECTION_MAC or PROTECTION_AEAD; see Frame.sealed and Frame.signed in
// protos/torch_grpc_pg.proto) is wrapped here, and unwrapped and checked on
// the other side before anything in it is believed. AES-256-GCM with the
// message's number on the link as the nonce: a message that was altered,
// dropped, replayed or reordered on the way fails its tag, and so does every
// message after it.
constexpr size_t kTagBytes = 16;

// What framing may add to a chunk and its header, protected or not: a Frame's
// field tags and lengths, and around it a protected message's own tag, length
// and the 16-byte authentication tag. The server's receive limit and the
// opener's bound leave this much room beyond a chunk and a header.
constexpr size_t kFramingBytes = 64;

// What a message failed: the caller names the link and fails the group.
class FrameAuthenticationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CipherContext;  // OpenSSL's, kept out of this header

// The sending side of one link. Not thread-safe: the link seals and queues each
// message under one lock, so that messages go out in the order of their numbers.
class FrameSealer {
 public:
  // `protection` is Mac or Aead; `key` has kKeyBytes.
  FrameSealer(Protection protection, const std::string& key);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  // The next message: the Frame whose encoding is `frame_prefix` followed by
  // `payload`, protected. `release` runs once the payload's memory may change:
  // at once when it is encrypted (the message holds a copy), else once gRPC
  // has sent it, as for an unprotected frame.
  grpc::ByteBuffer seal(const std::string& frame_prefix, ByteView payload, std::function<void()> release);

 private:
  grpc::ByteBuffer encrypt(const std::string& frame_prefix, ByteView payload);
  grpc::ByteBuffer sign(const std::string& frame_prefix, ByteView payload, std::function<void()> release);

  Protection protection_;
  std::unique_ptr<CipherContext> cipher_;
  uint64_t next_ = 0;  // the next message's number on the link
};

// The receiving side of one link, on the one thread that reads its stream.
class FrameOpener {
 public:
  // `max_frame_bytes` bounds the Frame inside a message; larger ones are
  // refused before any of it is decrypted or copied.
  FrameOpener(Protection protection, const std::string& key, size_t max_frame_bytes);
  ~FrameOpener();
  FrameOpener(const FrameOpener&) = delete;
  FrameOpener& operator=(const FrameOpener&) = delete;

  // The Frame inside the next message, once its tag checked. Throws
  // FrameAuthenticationError when it did not, std::runtime_error when the
  // message is not of the link's protection at all.
  grpc::ByteBuffer open(grpc::ByteBuffer&& message);
  // Messages opened so far.
  uint64_t opened() const { return next_; }

 private:
  Protection protection_;
  std::unique_ptr<CipherContext> cipher_;
  size_t max_frame_bytes_;
  uint64_t next_ = 0;
};

}  // namespace tgpg
