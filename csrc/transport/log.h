#pragma once

#include <string>

namespace tgpg {

// One line on stderr, prefixed so that users can tell whose it is. For events
// that need no exception but that an operator must hear about: a refused
// intruder, a deployment without authentication.
void log_warning(const std::string& message);

// log_warning for events a stranger can cause at will (refused connections):
// at most one line a second, the next one saying how many were left out, so
// that a flood of them cannot flood the log.
void log_warning_limited(const std::string& message);

}  // namespace tgpg
