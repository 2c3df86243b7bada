#include "transport/socket_dir.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace tgpg {
namespace {

constexpr const char* kPrefix = "torch-grpc-pg-";
constexpr const char* kSocketName = "rank.sock";

std::string temp_root() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

bool process_is_gone(pid_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

// Names are kPrefix + pid + "-" + random. Only our own directories of dead
// processes are removed: another user's are not ours to judge.
void remove_stale_dirs(const std::string& root) {
  DIR* dir = ::opendir(root.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  const size_t prefix_len = std::strlen(kPrefix);
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strncmp(entry->d_name, kPrefix, prefix_len) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name + prefix_len, &end, 10);
    if (end == entry->d_name + prefix_len || *end != '-' || !process_is_gone(static_cast<pid_t>(pid))) continue;
    const std::string path = root + "/" + entry->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid()) stale.push_back(path);
  }
  ::closedir(dir);
  for (const auto& path : stale) {
    ::unlink((path + "/" + kSocketName).c_str());
    ::rmdir(path.c_str());
  }
}

}  // namespace

PrivateSocketDir::PrivateSocketDir() {
  const std::string root = temp_root();
  remove_stale_dirs(root);
  std::string templ = root + "/" + kPrefix + std::to_string(::getpid()) + "-XXXXXX";
  // mkdtemp creates the directory with mode 0700 regardless of the umask.
  if (::mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error("could not create a private directory for the unix socket under " + root + ": " +
                             std::strerror(errno) + ". Set TMPDIR to a writable directory, or "
                             "TORCH_GRPC_PG_UNIX_SOCKETS=0.");
  }
  dir_ = templ;
  socket_path_ = dir_ + "/" + kSocketName;
}

PrivateSocketDir::~PrivateSocketDir() {
  ::unlink(socket_path_.c_str());
  ::rmdir(dir_.c_str());
}

}  // namespace tgpg
