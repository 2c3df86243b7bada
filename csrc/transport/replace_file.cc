#include "transport/replace_file.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace tgpg {

bool replace_file(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  // Unique per process and call, so that concurrent writers never share a
  // temporary; hidden and without the final name's suffix, so that a reader
  // globbing for the final files never picks one up.
  static std::atomic<unsigned long> next{0};
  const fs::path target(path);
  const fs::path temporary = target.parent_path() / ("." + target.filename().string() + "." +
                                                     std::to_string(::getpid()) + "." +
                                                     std::to_string(next.fetch_add(1)) + ".partial");
  std::error_code error;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      fs::remove(temporary, error);
      return false;
    }
  }
  fs::rename(temporary, target, error);
  if (!error) return true;
  fs::remove(temporary, error);
  return false;
}

}  // namespace tgpg
