// tgpg::OpQueue: jobs run one at a time in the order of their numbers, whether
// the worker runs them or a caller runs one on its own thread
// (run_here_if_idle); a caller runs one only when nothing is queued or running.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/op_queue.h"

namespace tgpg_test {
namespace {

using std::chrono::milliseconds;

// A gate that a job waits at until the test opens it.
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void pass() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

// The order in which events happened, across threads.
class Log {
 public:
  void add(std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(what));
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> events_;
};

const tgpg::OpQueue::Cancel kNoCancel = [](uint64_t, const std::string&) {};
const auto kIgnoreIssued = [](uint64_t) {};

void wait_until(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_TRUE(done());
}

TEST(OpQueue, AnIdleQueueRunsTheJobAndItsFinishOnTheCallersThread) {
  tgpg::OpQueue queue;
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on, finished_on;
  uint64_t issued_seq = 0, run_seq = 0;
  const bool ran = queue.run_here_if_idle(
      [&](uint64_t seq) -> tgpg::OpQueue::Finish {
        ran_on = std::this_thread::get_id();
        run_seq = seq;
        return [&] { finished_on = std::this_thread::get_id(); };
      },
      kNoCancel, [&](uint64_t seq) { issued_seq = seq; });
  EXPECT_TRUE(ran);
  EXPECT_EQ(ran_on, caller);
  EXPECT_EQ(finished_on, caller);
  EXPECT_EQ(issued_seq, 1u);
  EXPECT_EQ(run_seq, 1u);
  EXPECT_EQ(queue.last_seq(), 1u);
}

TEST(OpQueue, ACallerDoesNotRunHereWhileAJobIsQueuedOrRunning) {
  tgpg::OpQueue queue;
  Gate gate;
  std::atomic<bool> first_running{false};
  queue.push(
      [&](uint64_t) -> tgpg::OpQueue::Finish {
        first_running = true;
        gate.pass();
        return nullptr;
      },
      kNoCancel);
  queue.push([](uint64_t) -> tgpg::OpQueue::Finish { return nullptr; }, kNoCancel);
  wait_until([&] { return first_running.load(); });
  bool ran_here = false;
  EXPECT_FALSE(queue.run_here_if_idle(
      [&](uint64_t) -> tgpg::OpQueue::Finish {
        ran_here = true;
        return nullptr;
      },
      kNoCancel, kIgnoreIssued));
  EXPECT_FALSE(ran_here);
  EXPECT_EQ(queue.last_seq(), 2u);  // no number taken by the refused call
  gate.open();
}

TEST(OpQueue, TheWorkerStartsNoJobWhileACallerRunsOne) {
  tgpg::OpQueue queue;
  Log log;
  Gate gate;
  std::atomic<bool> caller_running{false};
  std::thread caller([&] {
    queue.run_here_if_idle(
        [&](uint64_t seq) -> tgpg::OpQueue::Finish {
          log.add("start " + std::to_string(seq));
          caller_running = true;
          gate.pass();
          log.add("end " + std::to_string(seq));
          return nullptr;
        },
        kNoCancel, kIgnoreIssued);
  });
  wait_until([&] { return caller_running.load(); });
  std::atomic<bool> second_done{false};
  queue.push(
      [&](uint64_t seq) -> tgpg::OpQueue::Finish {
        log.add("start " + std::to_string(seq));
        return [&] { second_done = true; };
      },
      kNoCancel);
  // Long enough for a worker that did not wait to have started the second job.
  std::this_thread::sleep_for(milliseconds(50));
  gate.open();
  caller.join();
  wait_until([&] { return second_done.load(); });
  EXPECT_EQ(log.events(), (std::vector<std::string>{"start 1", "end 1", "start 2"}));
}

TEST(OpQueue, AClosedQueueRunsNothingHere) {
  tgpg::OpQueue queue;
  queue.close("closed for the test");
  bool ran = false;
  EXPECT_FALSE(queue.run_here_if_idle(
      [&](uint64_t) -> tgpg::OpQueue::Finish {
        ran = true;
        return nullptr;
      },
      kNoCancel, kIgnoreIssued));
  EXPECT_FALSE(ran);
}

TEST(OpQueue, AnExceptionOutOfARunHereFailsTheJobAndTheQueueGoesOn) {
  tgpg::OpQueue queue;
  std::string reason;
  EXPECT_TRUE(queue.run_here_if_idle([](uint64_t) -> tgpg::OpQueue::Finish { throw std::runtime_error("boom"); },
                                     [&](uint64_t, const std::string& why) { reason = why; }, kIgnoreIssued));
  EXPECT_NE(reason.find("unexpected internal error"), std::string::npos) << reason;
  // The run part was left: the next caller runs too.
  EXPECT_TRUE(queue.run_here_if_idle([](uint64_t) -> tgpg::OpQueue::Finish { return nullptr; }, kNoCancel,
                                     kIgnoreIssued));
}

TEST(OpQueue, WaitRunOverWaitsForACallersJob) {
  tgpg::OpQueue queue;
  Gate gate;
  std::atomic<bool> caller_running{false};
  std::thread caller([&] {
    queue.run_here_if_idle(
        [&](uint64_t) -> tgpg::OpQueue::Finish {
          caller_running = true;
          gate.pass();
          return nullptr;
        },
        kNoCancel, kIgnoreIssued);
  });
  wait_until([&] { return caller_running.load(); });
  bool running = false;
  queue.close("closing", &running);
  EXPECT_TRUE(running);
  EXPECT_FALSE(queue.wait_run_over(milliseconds(30)));
  gate.open();
  EXPECT_TRUE(queue.wait_run_over(std::chrono::seconds(10)));
  caller.join();
}

}  // namespace
}  // namespace tgpg_test
