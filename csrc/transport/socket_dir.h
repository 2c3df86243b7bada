#pragma once

#include <string>

namespace tgpg {

// A directory only this user can enter (mode 0700, whatever the umask) that
// holds the process's unix socket, so that other local users cannot connect
// to it. Directories left behind by processes that died without cleaning up
// (SIGKILL) are removed when the next one is made.
class PrivateSocketDir {
 public:
  PrivateSocketDir();  // throws std::runtime_error if the directory cannot be made
  ~PrivateSocketDir();
  PrivateSocketDir(const PrivateSocketDir&) = delete;
  PrivateSocketDir& operator=(const PrivateSocketDir&) = delete;

  const std::string& socket_path() const { return socket_path_; }

 private:
  std::string dir_;
  std::string socket_path_;
};

}  // namespace tgpg
