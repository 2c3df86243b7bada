#include "transport/run_together.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <system_error>
#include <thread>

#include "transport/thread_name.h"

namespace tgpg {

void run_together(std::vector<std::function<void()>> tasks, size_t max_threads) {
  if (tasks.empty()) return;
  std::vector<std::exception_ptr> errors(tasks.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      try {
        tasks[i]();
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  // The calling thread is one of the workers: a single task runs on it alone.
  const size_t helpers = std::min(tasks.size(), std::max<size_t>(max_threads, 1)) - 1;
  std::vector<std::thread> threads;
  threads.reserve(helpers);
  for (size_t t = 0; t < helpers; ++t) {
    try {
      threads.emplace_back([&] {
        name_this_thread("tgpg-together");
        work();
      });
    } catch (const std::system_error&) {
      break;  // no thread to be had: the ones running, and this one, take the rest
    }
  }
  work();
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace tgpg
