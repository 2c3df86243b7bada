// tgpg::SendTracker: a wait ends when every payload is back, names the peers
// that still hold some at its deadline, and ends at once when the transport
// gives up, without letting the memory being sent go.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "algorithms/send_tracker.h"

namespace tgpg_test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(SendTracker, AWaitEndsWhenEveryPayloadIsBack) {
  tgpg::SendTracker tracker(nullptr);
  tracker.acquire(1);
  tracker.acquire(2);
  tracker.release(1);
  std::thread transport([&] {
    std::this_thread::sleep_for(milliseconds(20));
    tracker.release(2);
  });
  const auto outcome = tracker.wait_released(Clock::now() + std::chrono::seconds(10));
  transport.join();
  EXPECT_TRUE(outcome.released);
  EXPECT_TRUE(outcome.abandoned.empty());
  EXPECT_TRUE(outcome.holding.empty());
}

TEST(SendTracker, ATimedOutWaitNamesThePeersThatStillHoldPayloads) {
  tgpg::SendTracker tracker(nullptr);
  for (int dst : {1, 3, 3, 5}) tracker.acquire(dst);
  tracker.release(1);
  tracker.release(5);
  const auto outcome = tracker.wait_released(Clock::now() + milliseconds(20));
  EXPECT_FALSE(outcome.released);
  EXPECT_TRUE(outcome.abandoned.empty());
  EXPECT_EQ(outcome.holding, std::vector<int>{3});
}

TEST(SendTracker, AbandoningEndsAWaitAtOnceWithTheReason) {
  tgpg::SendTracker tracker(nullptr);
  tracker.acquire(1);
  std::thread transport([&] {
    std::this_thread::sleep_for(milliseconds(50));
    tracker.abandon("the connection to rank 1 broke");
  });
  const auto started = Clock::now();
  const auto outcome = tracker.wait_released(started + std::chrono::seconds(20));
  transport.join();
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(5));
  EXPECT_FALSE(outcome.released);
  EXPECT_EQ(outcome.abandoned, "the connection to rank 1 broke");
  EXPECT_EQ(outcome.holding, std::vector<int>{1});
  // Later waits end at once too; the first reason stays.
  tracker.abandon("something else");
  EXPECT_EQ(tracker.wait_released(Clock::now() + std::chrono::seconds(20)).abandoned,
            "the connection to rank 1 broke");
}

TEST(SendTracker, NothingHeldIsReleasedEvenWhenAbandoned) {
  tgpg::SendTracker tracker(nullptr);
  tracker.acquire(2);
  tracker.release(2);
  tracker.abandon("the group failed");
  EXPECT_TRUE(tracker.wait_released(Clock::now()).released);
}

TEST(SendTracker, TheMemoryBeingSentOutlivesAnAbandonedWait) {
  struct Memory {
    explicit Memory(std::atomic<bool>& freed) : freed(freed) {}
    ~Memory() { freed = true; }
    std::atomic<bool>& freed;
  };
  std::atomic<bool> freed{false};
  auto tensor = std::make_shared<Memory>(freed);
  auto tracker = std::make_shared<tgpg::SendTracker>(tensor);
  tensor.reset();
  tracker->acquire(1);
  // What a transport keeps until it lets go of the payload.
  std::function<void()> release = [held = tracker] { held->release(1); };
  tracker->abandon("the connection to rank 1 broke");
  EXPECT_FALSE(tracker->wait_released(Clock::now()).released);
  tracker.reset();  // the op has returned
  EXPECT_FALSE(freed.load());
  release();
  release = {};
  EXPECT_TRUE(freed.load());
}

}  // namespace
}  // namespace tgpg_test
