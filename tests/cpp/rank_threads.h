#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace tgpg_test {

// Runs body(rank) for every rank of a group, each on its own thread, and
// returns what each rank threw (null where it returned). Assertions belong on
// the calling thread, after every rank is done.
std::vector<std::exception_ptr> run_on_ranks(int world, const std::function<void(int rank)>& body);

// The message of what a rank threw; "" when it threw nothing.
std::string error_message(const std::exception_ptr& error);

}  // namespace tgpg_test
