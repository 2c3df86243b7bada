#pragma once

#include <string>

namespace tgpg {

// One line on stderr, prefixed so that users can tell whose it is. For events
// that need no exception but that an operator must hear about: a refused
// intruder, a deployment without authentication.
void log_warning(const std::string& message);

}  // namespace tgpg
