#include "same_host/shared_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace tgpg {
namespace {

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

// Not a secret: it tells an opener that the file it opened is the one offered.
std::string random_token() {
  std::string token(kSharedFileTokenBytes, '\0');
  size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t got = ::getrandom(token.data() + filled, token.size() - filled, 0);
    if (got < 0 && errno != EINTR) throw std::runtime_error(system_error("getrandom"));
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return token;
}

}  // namespace

SharedFile SharedFile::create(const char* name, size_t bytes, uint64_t magic) {
  if (bytes < kSharedFilePrologueBytes) throw std::invalid_argument("a shared file holds at least its prologue");
  SharedFile file;
  file.bytes_ = bytes;
  file.token_ = random_token();
  file.fd_ = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (file.fd_ < 0) throw std::runtime_error(system_error("memfd_create"));
  if (::ftruncate(file.fd_, static_cast<off_t>(bytes)) != 0) throw std::runtime_error(system_error("ftruncate"));
  // A file shrunk under another process's mapping would kill it with SIGBUS at
  // its next read; sealed, the size is fixed for good.
  if (::fcntl(file.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw std::runtime_error(system_error("sealing the memory file"));
  }
  file.map();
  std::memcpy(file.base_, &magic, sizeof(magic));
  std::memcpy(file.base_ + sizeof(magic), file.token_.data(), kSharedFileTokenBytes);
  return file;
}

SharedFile SharedFile::open(const SharedFileOffer& offer, size_t bytes, uint64_t magic) {
  if (offer.pid == 0 || offer.fd < 0 || offer.token.size() != kSharedFileTokenBytes) {
    throw std::runtime_error("it names no process, no file or no token");
  }
  const std::string path = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
  // Only a memory file, so that a forged offer cannot make this process open
  // a device or a pipe of the peer's. The peer could swap the descriptor after
  // this check, but the checks on the opened file below are what keep this
  // process safe.
  char target[64] = {};
  const ssize_t length = ::readlink(path.c_str(), target, sizeof(target) - 1);
  if (length < 0) throw std::runtime_error(system_error("reading " + path));
  if (std::strncmp(target, "/memfd:", 7) != 0) throw std::runtime_error(path + " is not a memory file");
  SharedFile file;
  file.bytes_ = bytes;
  file.fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (file.fd_ < 0) throw std::runtime_error(system_error("opening " + path));
  // The seals first: until they are set the maker could still cut the file
  // after its size was checked. Once sealed, the size checked below is the
  // size for good.
  const int seals = ::fcntl(file.fd_, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    throw std::runtime_error("the file is not sealed against resizing");
  }
  struct stat info = {};
  if (::fstat(file.fd_, &info) != 0) throw std::runtime_error(system_error("fstat"));
  if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) != bytes) {
    throw std::runtime_error("the file has " + std::to_string(info.st_size) + " bytes, not the " +
                             std::to_string(bytes) + " its shape needs");
  }
  file.map();
  // The mapping keeps the file; this process has no other use for the descriptor.
  ::close(std::exchange(file.fd_, -1));
  uint64_t found = 0;
  std::memcpy(&found, file.base_, sizeof(found));
  if (found != magic || std::memcmp(file.base_ + sizeof(magic), offer.token.data(), kSharedFileTokenBytes) != 0) {
    throw std::runtime_error("the file does not hold the offer's token");
  }
  file.token_ = offer.token;
  return file;
}

void SharedFile::map() {
  void* mapped = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (mapped == MAP_FAILED) throw std::runtime_error(system_error("mmap"));
  base_ = static_cast<std::byte*>(mapped);
}

SharedFile::SharedFile(SharedFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      token_(std::move(other.token_)) {}

SharedFile& SharedFile::operator=(SharedFile&& other) noexcept {
  SharedFile taken(std::move(other));  // what this held goes with `taken`
  std::swap(fd_, taken.fd_);
  std::swap(base_, taken.base_);
  std::swap(bytes_, taken.bytes_);
  std::swap(token_, taken.token_);
  return *this;
}

SharedFile::~SharedFile() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

SharedFileOffer SharedFile::offer() const { return SharedFileOffer{static_cast<uint32_t>(::getpid()), fd_, token_}; }

}  // namespace tgpg
