#include "transport/frame_protection.h"

#include <grpcpp/support/slice.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/wire_format.h"

namespace tgpg {
namespace {

// Protobuf tags of Frame's `sealed` (10) and `signed` (11): length-delimited.
constexpr uint8_t kSealedTag = (10 << 3) | 2;
constexpr uint8_t kSignedTag = (11 << 3) | 2;
constexpr size_t kIvBytes = 12;

uint8_t tag_of(Protection protection) { return protection == Protection::Aead ? kSealedTag : kSignedTag; }

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// The nonce of message `number`: four zero bytes, then the number, little-endian.
std::array<unsigned char, kIvBytes> nonce_of(uint64_t number) {
  std::array<unsigned char, kIvBytes> iv{};
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<unsigned char>(number >> (8 * i));
  return iv;
}

std::runtime_error openssl_failure(const char* what) {
  return std::runtime_error(std::string("AES-256-GCM ") + what + " failed in OpenSSL");
}

// OpenSSL's lengths are ints; a frame is at most 64 MiB plus its header, but
// every call goes through here so that none could wrap.
int int_length(size_t bytes) {
  if (bytes > static_cast<size_t>(INT32_MAX)) throw std::runtime_error("a frame too large for AES-GCM");
  return static_cast<int>(bytes);
}

// Memory handed to gRPC as a slice, freed by gRPC with std::free.
struct MallocDeleter {
  void operator()(void* p) const { std::free(p); }
};
using OwnedBytes = std::unique_ptr<unsigned char, MallocDeleter>;

OwnedBytes allocate(size_t bytes) {
  OwnedBytes owned(static_cast<unsigned char*>(std::malloc(bytes == 0 ? 1 : bytes)));
  if (!owned) throw std::bad_alloc();
  return owned;
}

grpc::Slice hand_to_grpc(OwnedBytes bytes, size_t size) {
  return grpc::Slice(bytes.release(), size, &std::free);
}

// The bytes of a message spread over slices, visited in order, split at `split`
// (the bytes before it go to `body`, the rest to `tail`).
template <typename Body, typename Tail>
void visit_split(const std::vector<grpc::Slice>& slices, size_t skip, size_t split, Body&& body, Tail&& tail) {
  size_t at = 0;  // position in the message
  for (const grpc::Slice& slice : slices) {
    const unsigned char* data = slice.begin();
    size_t size = slice.size();
    if (at + size <= skip) {
      at += size;
      continue;
    }
    if (at < skip) {
      data += skip - at;
      size -= skip - at;
      at = skip;
    }
    if (at < split) {
      const size_t take = std::min(size, split - at);
      body(data, take);
      data += take;
      size -= take;
      at += take;
    }
    if (size > 0) {
      tail(data, size);
      at += size;
    }
  }
}

}  // namespace

struct CipherContext {
  CipherContext(const std::string& key, bool encrypt) : ctx(EVP_CIPHER_CTX_new()) {
    if (ctx == nullptr) throw std::bad_alloc();
    if (key.size() != kKeyBytes) throw std::invalid_argument("a link key has 32 bytes");
    const auto* k = reinterpret_cast<const unsigned char*>(key.data());
    const int ok = encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, k, nullptr)
                           : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, k, nullptr);
    if (ok != 1) throw openssl_failure("key setup");
  }
  ~CipherContext() { EVP_CIPHER_CTX_free(ctx); }
  CipherContext(const CipherContext&) = delete;
  CipherContext& operator=(const CipherContext&) = delete;

  EVP_CIPHER_CTX* ctx;
};

FrameSealer::FrameSealer(Protection protection, const std::string& key)
    : protection_(protection), cipher_(std::make_unique<CipherContext>(key, /*encrypt=*/true)) {
  if (protection == Protection::None) throw std::invalid_argument("a FrameSealer protects");
}

FrameSealer::~FrameSealer() = default;

grpc::ByteBuffer FrameSealer::seal(const std::string& frame_prefix, ByteView payload, std::function<void()> release) {
  if (protection_ == Protection::Aead) {
    grpc::ByteBuffer message = encrypt(frame_prefix, payload);
    if (release) release();  // the message holds the payload's ciphertext, not the payload
    return message;
  }
  return sign(frame_prefix, payload, std::move(release));
}

grpc::ByteBuffer FrameSealer::encrypt(const std::string& frame_prefix, ByteView payload) {
  EVP_CIPHER_CTX* ctx = cipher_->ctx;
  const auto iv = nonce_of(next_++);
  const size_t frame_bytes = frame_prefix.size() + payload.size;
  std::string outer(1, static_cast<char>(kSealedTag));
  append_varint(outer, frame_bytes + kTagBytes);
  OwnedBytes sealed = allocate(frame_bytes + kTagBytes);
  int written = 0;
  if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) != 1 ||
      EVP_EncryptUpdate(ctx, sealed.get(), &written, reinterpret_cast<const unsigned char*>(frame_prefix.data()),
                        int_length(frame_prefix.size())) != 1 ||
      (payload.size > 0 &&
       EVP_EncryptUpdate(ctx, sealed.get() + frame_prefix.size(), &written,
                         reinterpret_cast<const unsigned char*>(payload.data), int_length(payload.size)) != 1) ||
      EVP_EncryptFinal_ex(ctx, sealed.get() + frame_bytes, &written) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, sealed.get() + frame_bytes) != 1) {
    throw openssl_failure("encryption");
  }
  grpc::Slice slices[] = {grpc::Slice(outer), hand_to_grpc(std::move(sealed), frame_bytes + kTagBytes)};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer FrameSealer::sign(const std::string& frame_prefix, ByteView payload, std::function<void()> release) {
  EVP_CIPHER_CTX* ctx = cipher_->ctx;
  const auto iv = nonce_of(next_++);
  const size_t frame_bytes = frame_prefix.size() + payload.size;
  std::string head(1, static_cast<char>(kSignedTag));
  append_varint(head, frame_bytes + kTagBytes);
  head += frame_prefix;
  std::string tag(kTagBytes, '\0');
  int written = 0;
  // GMAC: the frame goes in as associated data only, so it is authenticated
  // without being copied; the payload is sent from where it lies.
  if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) != 1 ||
      EVP_EncryptUpdate(ctx, nullptr, &written, reinterpret_cast<const unsigned char*>(frame_prefix.data()),
                        int_length(frame_prefix.size())) != 1 ||
      (payload.size > 0 && EVP_EncryptUpdate(ctx, nullptr, &written, reinterpret_cast<const unsigned char*>(payload.data),
                                             int_length(payload.size)) != 1) ||
      EVP_EncryptFinal_ex(ctx, nullptr, &written) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag.data()) != 1) {
    throw openssl_failure("authentication");
  }
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head);
  if (payload.size > 0) slices.push_back(borrowed_slice(payload, std::move(release)));
  else if (release) release();
  slices.emplace_back(tag);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

FrameOpener::FrameOpener(Protection protection, const std::string& key, size_t max_frame_bytes)
    : protection_(protection),
      cipher_(std::make_unique<CipherContext>(key, /*encrypt=*/protection == Protection::Mac)),
      max_frame_bytes_(max_frame_bytes) {
  if (protection == Protection::None) throw std::invalid_argument("a FrameOpener checks protected frames");
}

FrameOpener::~FrameOpener() = default;

grpc::ByteBuffer FrameOpener::open(grpc::ByteBuffer&& message) {
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) throw std::runtime_error("unreadable message");
  message.Clear();
  const size_t total = [&] {
    size_t n = 0;
    for (const auto& s : slices) n += s.size();
    return n;
  }();
  // The outer Frame: one tag byte, the varint length of its one field, the field.
  std::string head;
  for (const auto& s : slices) {
    head.append(reinterpret_cast<const char*>(s.begin()), std::min<size_t>(s.size(), 11 - head.size()));
    if (head.size() == 11) break;
  }
  const char* expected = protection_ == Protection::Aead ? "sealed" : "signed";
  if (head.empty() || static_cast<uint8_t>(head[0]) != tag_of(protection_)) {
    throw std::runtime_error(std::string("a message that is not ") + expected + ", on a link whose every message is");
  }
  uint64_t length = 0;
  size_t at = 1;
  for (int shift = 0;; shift += 7) {
    if (at >= head.size() || shift > 63) throw std::runtime_error("a malformed message length");
    const uint8_t b = static_cast<uint8_t>(head[at++]);
    length |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) break;
  }
  if (length < kTagBytes || length - kTagBytes > max_frame_bytes_) {
    throw std::runtime_error("a " + std::string(expected) + " message of " + std::to_string(length) +
                             " bytes, where at most " + std::to_string(max_frame_bytes_ + kTagBytes) + " fit");
  }
  if (total != at + length) throw std::runtime_error("a message whose length says otherwise");
  const size_t frame_bytes = length - kTagBytes;
  const size_t tag_at = at + frame_bytes;

  EVP_CIPHER_CTX* ctx = cipher_->ctx;
  const auto iv = nonce_of(next_++);
  std::string tag;
  tag.reserve(kTagBytes);
  const auto collect_tag = [&](const unsigned char* data, size_t size) {
    tag.append(reinterpret_cast<const char*>(data), size);
  };
  int written = 0;
  bool ok = true;
  if (protection_ == Protection::Aead) {
    if (EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) != 1) throw openssl_failure("decryption");
    OwnedBytes plain = allocate(frame_bytes);
    size_t out = 0;
    visit_split(slices, at, tag_at,
                [&](const unsigned char* data, size_t size) {
                  ok = ok && EVP_DecryptUpdate(ctx, plain.get() + out, &written, data, int_length(size)) == 1;
                  out += size;
                },
                collect_tag);
    ok = ok && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) == 1 &&
         EVP_DecryptFinal_ex(ctx, plain.get() + out, &written) == 1;
    if (!ok) throw FrameAuthenticationError("message #" + std::to_string(next_ - 1) + " on the link");
    grpc::Slice frame = hand_to_grpc(std::move(plain), frame_bytes);
    return grpc::ByteBuffer(&frame, 1);
  }
  // Signed: the tag over the frame as associated data, then the frame's own slices.
  if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) != 1) throw openssl_failure("authentication");
  std::vector<grpc::Slice> frame;
  size_t position = 0;  // of the slice being visited, in the message
  for (const grpc::Slice& slice : slices) {
    const size_t begin = std::max(position, at), end = std::min(position + slice.size(), tag_at);
    if (begin < end) frame.push_back(slice.sub(begin - position, end - position));
    position += slice.size();
  }
  visit_split(slices, at, tag_at,
              [&](const unsigned char* data, size_t size) {
                ok = ok && EVP_EncryptUpdate(ctx, nullptr, &written, data, int_length(size)) == 1;
              },
              collect_tag);
  unsigned char computed[kTagBytes];
  ok = ok && EVP_EncryptFinal_ex(ctx, nullptr, &written) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, computed) == 1 && tag.size() == kTagBytes &&
       CRYPTO_memcmp(computed, tag.data(), kTagBytes) == 0;
  if (!ok) throw FrameAuthenticationError("message #" + std::to_string(next_ - 1) + " on the link");
  return grpc::ByteBuffer(frame.data(), frame.size());
}

}  // namespace tgpg
