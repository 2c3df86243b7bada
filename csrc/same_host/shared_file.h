#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tgpg {

// A memory file that processes of one user on one host map together: one
// process makes it, sealed against resizing, with a magic number and a random
// token in its first 40 bytes; the others open it through /proc/<pid>/fd/<fd>,
// which the kernel allows only for a process of the same user, and check it
// before they map it. Shared rings and segments are such files.
constexpr size_t kSharedFileTokenBytes = 32;
constexpr size_t kSharedFilePrologueBytes = 8 + kSharedFileTokenBytes;

// Where the file lies in the process that made it, and the token it holds.
struct SharedFileOffer {
  uint32_t pid = 0;
  int32_t fd = -1;
  std::string token;
};

class SharedFile {
 public:
  // Makes, seals and maps a zeroed file of `bytes` that begins with `magic` and
  // a fresh token. Throws std::runtime_error (no memfd_create, no memory).
  static SharedFile create(const char* name, size_t bytes, uint64_t magic);

  // Opens the file `offer` names and maps it, refusing (std::runtime_error,
  // saying why) anything but a memory file sealed against shrinking and
  // growing, of exactly `bytes`, beginning with `magic` and the offer's token.
  // The seals are checked before the size: until they are set, the maker
  // could cut the file after its size was checked, and a read past the new end
  // would kill this process with SIGBUS.
  static SharedFile open(const SharedFileOffer& offer, size_t bytes, uint64_t magic);

  SharedFile(SharedFile&& other) noexcept;
  SharedFile& operator=(SharedFile&& other) noexcept;
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;
  ~SharedFile();

  std::byte* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // This process's offer of the file (its maker's; an opener has closed its descriptor).
  SharedFileOffer offer() const;

 private:
  SharedFile() = default;
  void map();

  int fd_ = -1;
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  std::string token_;
};

}  // namespace tgpg
