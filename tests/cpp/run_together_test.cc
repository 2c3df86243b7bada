// tgpg::run_together, which opens a group's links at once: every task runs
// once, tasks really overlap, no more than the bound run at a time, and the
// error rethrown is the first task's in the order given, whichever thread
// finished first.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "transport/run_together.h"

namespace tgpg_test {
namespace {

using std::chrono::milliseconds;

TEST(RunTogether, NothingToRun) { tgpg::run_together({}); }

TEST(RunTogether, RunsEveryTaskOnce) {
  std::vector<std::atomic<int>> runs(100);
  std::vector<std::function<void()>> tasks;
  for (auto& count : runs) tasks.emplace_back([&count] { ++count; });
  tgpg::run_together(std::move(tasks), 4);
  for (const auto& count : runs) EXPECT_EQ(count.load(), 1);
}

// Each task waits until all have started: run one after another they would
// wait out the timeout instead (and fail, not hang).
TEST(RunTogether, TasksOverlap) {
  constexpr int kTasks = 6;
  std::mutex mutex;
  std::condition_variable cv;
  int started = 0;
  std::atomic<int> met{0};
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < kTasks; ++i) {
    tasks.emplace_back([&] {
      std::unique_lock<std::mutex> lock(mutex);
      ++started;
      cv.notify_all();
      if (cv.wait_for(lock, std::chrono::seconds(10), [&] { return started == kTasks; })) ++met;
    });
  }
  tgpg::run_together(std::move(tasks), kTasks);
  EXPECT_EQ(met.load(), kTasks);
}

TEST(RunTogether, NoMoreThanTheBoundAtOnce) {
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < 24; ++i) {
    tasks.emplace_back([&] {
      const int now = ++running;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(milliseconds(2));
      --running;
    });
  }
  tgpg::run_together(std::move(tasks), 3);
  EXPECT_GE(most.load(), 1);
  EXPECT_LE(most.load(), 3);
}

// Task 7 throws at once, task 3 only after task 7 has: the error is still
// task 3's, and every task ran.
TEST(RunTogether, RethrowsTheFirstFailureInTaskOrder) {
  std::atomic<bool> seventh_threw{false};
  std::atomic<int> ran{0};
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < 10; ++i) {
    tasks.emplace_back([&, i] {
      ++ran;
      if (i == 7) {
        seventh_threw = true;
        throw std::runtime_error("task 7");
      }
      if (i == 3) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!seventh_threw && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
        throw std::runtime_error("task 3");
      }
    });
  }
  try {
    tgpg::run_together(std::move(tasks), 10);
    FAIL() << "run_together did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "task 3");
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(RunTogether, OneThreadRunsThemInOrder) {
  std::vector<int> order;
  std::vector<std::function<void()>> tasks;
  for (int i = 0; i < 5; ++i) tasks.emplace_back([&order, i] { order.push_back(i); });
  tgpg::run_together(std::move(tasks), 1);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace tgpg_test
