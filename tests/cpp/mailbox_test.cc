// tgpg::Mailbox: per-peer order, the bound that pauses a peer's stream, and
// every way a waiting take must end.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "algorithms/collective_error.h"
#include "transport/mailbox.h"

namespace tgpg_test {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// For tests of the frame bound: a byte bound that frames without payload never reach.
constexpr size_t kNoByteBound = size_t{1} << 30;

tgpg::Deadline far_deadline() { return Clock::now() + std::chrono::seconds(20); }

// Counts resumes, and lets a reader thread wait for the next one as a gRPC
// stream would wait before its next read.
class TestGate : public tgpg::ReadGate {
 public:
  void resume() override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++resumes_;
    resumed_.notify_all();
  }
  int resumes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return resumes_;
  }
  // Waits until resume() has been called more than `seen` times.
  bool wait_beyond(int seen, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return resumed_.wait_for(lock, timeout, [&] { return resumes_ > seen; });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable resumed_;
  int resumes_ = 0;
};

// A frame whose owner counts its own destruction, so that tests can see
// when the mailbox lets go of what it holds.
tgpg::ReceivedFrame frame(uint64_t seq, const std::shared_ptr<std::atomic<int>>& dropped = nullptr) {
  tgpg::ReceivedFrame f;
  f.header.seq = seq;
  if (dropped) {
    f.owner = std::shared_ptr<const void>(new int(0), [dropped](const void* p) {
      delete static_cast<const int*>(p);
      ++*dropped;
    });
  }
  return f;
}

// A frame whose payload is `bytes` long (its contents do not matter here).
tgpg::ReceivedFrame frame_of_bytes(uint64_t seq, size_t bytes) {
  static const std::vector<std::byte> backing(1 << 16);
  tgpg::ReceivedFrame f = frame(seq);
  // Two views, as a frame cut over two receive buffers would be.
  f.payload.push_back({backing.data(), bytes / 2});
  f.payload.push_back({backing.data(), bytes - bytes / 2});
  return f;
}

TEST(Mailbox, KeepsEachSourceInOrderAndApart) {
  tgpg::Mailbox mailbox(0, 3, 8, kNoByteBound);
  auto gate = std::make_shared<TestGate>();
  for (uint64_t seq : {1, 2, 3}) EXPECT_TRUE(mailbox.deliver(1, frame(seq), gate));
  for (uint64_t seq : {10, 11}) EXPECT_TRUE(mailbox.deliver(2, frame(seq), gate));
  EXPECT_EQ(mailbox.take(2, far_deadline()).header.seq, 10u);
  EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, 1u);
  EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, 2u);
  EXPECT_EQ(mailbox.take(2, far_deadline()).header.seq, 11u);
  EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, 3u);
  EXPECT_THROW(mailbox.take(2, Clock::now() + milliseconds(10)), tgpg::PeerTimeout);
  EXPECT_EQ(gate->resumes(), 0);
}

TEST(Mailbox, FullQueuePausesTheStreamUntilDrained) {
  const size_t bound = 4;
  tgpg::Mailbox mailbox(0, 2, bound, kNoByteBound);
  auto gate = std::make_shared<TestGate>();
  size_t delivered = 0;
  while (mailbox.deliver(1, frame(delivered + 1), gate)) {
    ++delivered;
    ASSERT_LT(delivered, bound) << "the queue grew past its bound without pausing the stream";
  }
  ++delivered;
  EXPECT_EQ(delivered, bound);
  EXPECT_EQ(gate->resumes(), 0) << "resumed before anything was taken";
  for (size_t i = 1; i <= delivered; ++i) EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, i);
  EXPECT_EQ(gate->resumes(), 1) << "a drained queue must resume its stream exactly once";
  // The resumed stream delivers again as before.
  EXPECT_TRUE(mailbox.deliver(1, frame(100), gate));
  EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, 100u);
  EXPECT_EQ(gate->resumes(), 1);
}

TEST(Mailbox, FailWakesAWaitingTake) {
  tgpg::Mailbox mailbox(0, 3, 8, kNoByteBound);
  std::string message;
  Clock::duration waited{};
  std::thread taker([&] {
    const auto start = Clock::now();
    try {
      mailbox.take(1, far_deadline());
    } catch (const tgpg::PeerTimeout& e) {
      message = std::string("timed out instead: ") + e.what();
    } catch (const tgpg::CollectiveError& e) {
      message = e.what();
    }
    waited = Clock::now() - start;
  });
  std::this_thread::sleep_for(milliseconds(50));
  mailbox.fail("rank 1 aborted: out of memory");
  taker.join();
  EXPECT_EQ(message, "rank 1 aborted: out of memory");
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_TRUE(mailbox.failed());
  // The first reason stays; every later wait, on any source, fails with it.
  mailbox.fail("a later reason");
  EXPECT_EQ(mailbox.failure(), "rank 1 aborted: out of memory");
  mailbox.deliver(2, frame(1), std::make_shared<TestGate>());
  try {
    mailbox.take(2, far_deadline());
    ADD_FAILURE() << "take on a failed mailbox returned";
  } catch (const tgpg::CollectiveError& e) {
    EXPECT_STREQ(e.what(), "rank 1 aborted: out of memory");
  }
}

TEST(Mailbox, CloseSourceEndsThatSourceOnlyAfterItsFrames) {
  tgpg::Mailbox mailbox(0, 3, 8, kNoByteBound);
  auto gate = std::make_shared<TestGate>();
  EXPECT_TRUE(mailbox.deliver(1, frame(7), gate));
  mailbox.close_source(1, "rank 1 closed its stream");
  EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, 7u) << "frames that arrived before the end still count";
  try {
    mailbox.take(1, far_deadline());
    ADD_FAILURE() << "take from a closed source returned";
  } catch (const tgpg::PeerTimeout&) {
    ADD_FAILURE() << "a closed source must fail at once, not time out";
  } catch (const tgpg::CollectiveError& e) {
    EXPECT_STREQ(e.what(), "rank 1 closed its stream");
  }
  EXPECT_FALSE(mailbox.failed());
  EXPECT_THROW(mailbox.take(2, Clock::now() + milliseconds(10)), tgpg::PeerTimeout);
}

TEST(Mailbox, CloseSourceWakesAWaitingTake) {
  tgpg::Mailbox mailbox(0, 2, 8, kNoByteBound);
  std::string message;
  std::thread taker([&] {
    try {
      mailbox.take(1, far_deadline());
    } catch (const tgpg::CollectiveError& e) {
      message = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(50));
  mailbox.close_source(1, "connection reset");
  taker.join();
  EXPECT_EQ(message, "connection reset");
}

TEST(Mailbox, ShutDownDropsFramesAndResumesPausedStreams) {
  tgpg::Mailbox mailbox(0, 3, 2, kNoByteBound);
  auto dropped = std::make_shared<std::atomic<int>>(0);
  auto gate1 = std::make_shared<TestGate>();
  auto gate2 = std::make_shared<TestGate>();
  int delivered = 0;
  while (mailbox.deliver(1, frame(1, dropped), gate1)) ++delivered;
  ++delivered;
  EXPECT_TRUE(mailbox.deliver(2, frame(1, dropped), gate2));
  ++delivered;
  EXPECT_EQ(*dropped, 0);
  mailbox.shut_down();
  EXPECT_EQ(*dropped, delivered) << "shut_down must free every queued frame";
  // A paused stream must read on, to drain and see its end; an unpaused one needs nothing.
  EXPECT_EQ(gate1->resumes(), 1);
  EXPECT_EQ(gate2->resumes(), 0);
  // What still arrives is dropped, and never pauses a stream again.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(mailbox.deliver(1, frame(2, dropped), gate1));
  EXPECT_EQ(*dropped, delivered + 5);
  EXPECT_TRUE(mailbox.failed());
  EXPECT_THROW(mailbox.take(1, far_deadline()), tgpg::CollectiveError);
}

TEST(Mailbox, TakeTimesOutWithPeerTimeout) {
  tgpg::Mailbox mailbox(0, 2, 8, kNoByteBound);
  const auto start = Clock::now();
  EXPECT_THROW(mailbox.take(1, start + milliseconds(100)), tgpg::PeerTimeout);
  EXPECT_GE(Clock::now() - start, milliseconds(100));
  EXPECT_FALSE(mailbox.failed()) << "a timeout is the collective's business, not the group's";
}

// Readers on two streams race a taker; each reader stops whenever the mailbox
// says so and waits for its gate, as ExchangeReactor does. Every frame must
// arrive once, in order, without the queue ever passing its bound.
TEST(Mailbox, ConcurrentStreamsAndTaker) {
  const int frames_per_source = 3000;
  const size_t bound = 3;
  tgpg::Mailbox mailbox(0, 3, bound, kNoByteBound);
  auto reader = [&](int src) {
    auto gate = std::make_shared<TestGate>();
    for (int i = 0; i < frames_per_source; ++i) {
      const int seen = gate->resumes();
      if (!mailbox.deliver(src, frame(i), gate)) {
        ASSERT_TRUE(gate->wait_beyond(seen, std::chrono::seconds(20))) << "stream " << src << " never resumed";
      }
    }
  };
  std::thread r1(reader, 1);
  std::thread r2(reader, 2);
  bool in_order = true;
  try {
    for (int i = 0; i < frames_per_source; ++i) {
      // Alternating sources makes one stream wait while the other is drained.
      for (int src : {1, 2}) {
        if (mailbox.take(src, far_deadline()).header.seq != static_cast<uint64_t>(i)) in_order = false;
      }
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "take failed: " << e.what();
    mailbox.shut_down();  // resumes paused readers, so that they can be joined
  }
  r1.join();
  r2.join();
  EXPECT_TRUE(in_order);
  EXPECT_THROW(mailbox.take(1, Clock::now() + milliseconds(10)), tgpg::PeerTimeout);
}

TEST(Mailbox, QueuedBytesPauseTheStreamToo) {
  const size_t byte_bound = 1000;
  tgpg::Mailbox mailbox(0, 2, 100, byte_bound);
  auto gate = std::make_shared<TestGate>();
  size_t delivered = 0;
  while (mailbox.deliver(1, frame_of_bytes(delivered + 1, 300), gate)) {
    ++delivered;
    ASSERT_LT(delivered * 300, byte_bound) << "the queue passed its byte bound without pausing the stream";
  }
  ++delivered;
  EXPECT_GE(delivered * 300, byte_bound) << "paused before the byte bound was reached";
  for (size_t i = 1; i <= delivered; ++i) EXPECT_EQ(mailbox.take(1, far_deadline()).header.seq, i);
  EXPECT_EQ(gate->resumes(), 1);
}

// A frame bigger than the whole byte bound must still get through.
TEST(Mailbox, OversizedFrameStillFlows) {
  tgpg::Mailbox mailbox(0, 2, 8, 100);
  auto gate = std::make_shared<TestGate>();
  EXPECT_FALSE(mailbox.deliver(1, frame_of_bytes(1, 5000), gate));
  const tgpg::ReceivedFrame taken = mailbox.take(1, far_deadline());
  EXPECT_EQ(taken.payload_bytes(), 5000u);
  EXPECT_EQ(gate->resumes(), 1);
  EXPECT_FALSE(mailbox.deliver(1, frame_of_bytes(2, 5000), gate));
}

// The hook tells the peers; it must run once, with the first reason, and
// outside the mailbox's lock, because it may call back into the mailbox.
TEST(Mailbox, FirstFailureHookRunsOnceOutsideTheLock) {
  tgpg::Mailbox mailbox(0, 2, 8, kNoByteBound);
  std::vector<std::string> calls;
  std::string failure_seen_by_hook;
  mailbox.on_first_failure([&](const std::string& reason) {
    calls.push_back(reason);
    failure_seen_by_hook = mailbox.failure();
  });
  mailbox.fail("first");
  mailbox.fail("second");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], "first");
  EXPECT_EQ(failure_seen_by_hook, "first");
}

TEST(Mailbox, NoFailureHookAfterShutDown) {
  tgpg::Mailbox mailbox(0, 2, 8, kNoByteBound);
  int calls = 0;
  mailbox.on_first_failure([&](const std::string&) { ++calls; });
  mailbox.shut_down();
  mailbox.fail("too late");
  EXPECT_EQ(calls, 0);
}

// shut_down must not return while the hook runs, since the hook may use the
// object that is being destroyed.
TEST(Mailbox, ShutDownWaitsForARunningHook) {
  tgpg::Mailbox mailbox(0, 2, 8, kNoByteBound);
  std::atomic<bool> hook_started{false};
  std::atomic<bool> hook_done{false};
  mailbox.on_first_failure([&](const std::string&) {
    hook_started = true;
    std::this_thread::sleep_for(milliseconds(100));
    hook_done = true;
  });
  std::thread failer([&] { mailbox.fail("boom"); });
  while (!hook_started) std::this_thread::yield();
  mailbox.shut_down();
  EXPECT_TRUE(hook_done) << "shut_down returned while the failure hook was still running";
  failer.join();
}

}  // namespace
}  // namespace tgpg_test
