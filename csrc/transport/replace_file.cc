#include "transport/replace_file.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>

namespace tgpg {

bool replace_file(const std::string& path, const std::string& content) {
  // Unique per process and call, so that concurrent writers never share a
  // temporary; hidden and without the final name's suffix, so that a reader
  // globbing for the final files never picks one up.
  static std::atomic<unsigned long> next{0};
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string temporary =
      dir + "." + base + "." + std::to_string(::getpid()) + "." + std::to_string(next.fetch_add(1)) + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

}  // namespace tgpg
