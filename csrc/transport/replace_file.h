#pragma once

#include <string>

namespace tgpg {

// Puts `content` at `path` in one step: written to a file of its own beside
// `path`, then renamed over it. A reader sees the old file or the new one,
// never half of either; when two threads replace the same file, the last
// rename wins whole, where two writers truncating one file would leave the
// longer one's tail after the shorter one. Returns false, leaving `path` as it
// was, when the directory cannot be written.
bool replace_file(const std::string& path, const std::string& content);

}  // namespace tgpg
