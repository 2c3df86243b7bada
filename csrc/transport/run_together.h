#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace tgpg {

// Runs independent tasks on threads of their own and returns once every one
// has ended. For work that mostly waits (opening a link is a few round trips
// between two event loops), so that the waits overlap instead of adding up:
// a group of world W opens 2 (W - 1) links per rank when it is created.
// At most `max_threads` run at once. If tasks threw, the exception of the
// first of them in the order given is rethrown, so that the message does not
// depend on which thread finished first; the others are dropped.
void run_together(std::vector<std::function<void()>> tasks, size_t max_threads = 32);

}  // namespace tgpg
