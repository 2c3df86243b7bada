#include "rank_threads.h"

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace tgpg_test {

std::vector<std::exception_ptr> run_on_ranks(int world, const std::function<void(int rank)>& body) {
  std::vector<std::exception_ptr> errors(world);
  // All ranks start together, so that no rank's deadline runs down while its
  // peers' threads are still being created; tests with short timeouts
  // depend on it.
  std::mutex mutex;
  std::condition_variable all_started;
  int started = 0;
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (++started == world) all_started.notify_all();
        all_started.wait(lock, [&] { return started == world; });
      }
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::string error_message(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(an exception that is not a std::exception)";
  }
}

}  // namespace tgpg_test
