// Ranks that disagree, fail or fall silent must make their peers throw a
// CollectiveError that says what happened, instead of hanging or returning
// plausible garbage.

#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/collectives.h"
#include "group_run.h"
#include "rank_threads.h"
#include "reference.h"

namespace tgpg_test {
namespace {

using tgpg::DType;
using tgpg::OpType;
using tgpg::ReduceOp;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr size_t kAlwaysDirect = std::numeric_limits<size_t>::max();
constexpr size_t kAlwaysRing = 0;
// Ranks that never hear of the mismatch give up after this; short, so that
// the tests stay fast.
constexpr milliseconds kShortTimeout{250};

bool is_collective_error(const std::exception_ptr& error) {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const tgpg::CollectiveError&) {
    return true;
  } catch (...) {
    return false;
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

Call allreduce_call(uint64_t count = 24) {
  Call c;
  c.op = OpType::Allreduce;
  c.dtype = DType::Float32;
  c.count = count;
  c.chunk_bytes = 16;
  c.reduction = tgpg::Reduction{ReduceOp::Sum, false};
  c.timeout = kShortTimeout;
  return c;
}

// A buffer per rank big enough for every call below, as raw pointers taken
// before the rank threads start.
struct Buffers {
  explicit Buffers(int world) : storage(world, std::vector<std::byte>(4096)) {
    for (auto& b : storage) data.push_back(b.data());
  }
  std::vector<std::vector<std::byte>> storage;
  std::vector<std::byte*> data;
};

// Runs allreduce (or broadcast for Broadcast calls) with per-rank calls.
GroupResult run_mixed(const std::vector<Call>& calls, size_t direct_max_bytes, MemoryOptions options = {}) {
  Buffers buffers(static_cast<int>(calls.size()));
  return run_group(calls, options, [&](tgpg::Collective& c, int rank) {
    if (calls[rank].op == OpType::Broadcast) {
      tgpg::broadcast(c, buffers.data[rank], direct_max_bytes);
    } else {
      tgpg::allreduce(c, buffers.data[rank], direct_max_bytes);
    }
  });
}

// The receiving rank must throw a CollectiveError that names itself and the
// peer it disagrees with, and shows both sides of the disagreement.
void expect_mismatch(const GroupResult& result, int receiver, int sender, const std::vector<std::string>& details) {
  const std::string message = error_message(result.errors.at(receiver));
  ASSERT_TRUE(is_collective_error(result.errors[receiver]))
      << "rank " << receiver << " should have thrown a CollectiveError, threw: '" << message << "'";
  EXPECT_TRUE(contains(message, "does not match")) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(receiver))) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(sender))) << message;
  for (const auto& d : details) EXPECT_TRUE(contains(message, d)) << "'" << d << "' missing from: " << message;
}

TEST(Mismatch, Count) {
  for (size_t direct : {kAlwaysDirect, kAlwaysRing}) {
    std::vector<Call> calls(2, allreduce_call(24));
    calls[1].count = 25;
    const GroupResult result = run_mixed(calls, direct);
    expect_mismatch(result, 0, 1, {"24 elements", "25 elements"});
    expect_mismatch(result, 1, 0, {"24 elements", "25 elements"});
  }
}

TEST(Mismatch, DtypeOfTheSameSize) {
  std::vector<Call> calls(3, allreduce_call());
  calls[2].dtype = DType::Int32;
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  expect_mismatch(result, 0, 2, {"float32", "int32"});
  expect_mismatch(result, 2, 0, {"float32", "int32"});
}

TEST(Mismatch, DtypeOfAnotherSize) {
  std::vector<Call> calls(2, allreduce_call());
  calls[1].dtype = DType::Float64;
  const GroupResult result = run_mixed(calls, kAlwaysRing);
  expect_mismatch(result, 0, 1, {"float32", "float64"});
}

TEST(Mismatch, OpType) {
  std::vector<Call> calls(2, allreduce_call());
  calls[1].op = OpType::Broadcast;
  calls[1].root = 1;
  calls[1].reduction.reset();
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  expect_mismatch(result, 0, 1, {"allreduce", "broadcast"});
  expect_mismatch(result, 1, 0, {"allreduce", "broadcast"});
}

TEST(Mismatch, AllreduceAgainstReduce) {
  std::vector<Call> calls(2, allreduce_call());
  calls[1].op = OpType::Reduce;
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  expect_mismatch(result, 0, 1, {"allreduce", "reduce"});
}

// Two ranks that both believe they are the root would otherwise each return
// their own data; every world size and both paths must catch it.
TEST(Mismatch, BroadcastRoot) {
  for (int world = 2; world <= 4; ++world) {
    for (size_t direct : {kAlwaysDirect, kAlwaysRing}) {
      SCOPED_TRACE("world " + std::to_string(world) + (direct == kAlwaysRing ? ", ring" : ", direct"));
      Call c = allreduce_call();
      c.op = OpType::Broadcast;
      c.reduction.reset();
      std::vector<Call> calls(world, c);
      calls[1].root = 1;  // rank 1 alone believes it is the root; the others say rank 0
      const GroupResult result = run_mixed(calls, direct);
      bool caught = false;
      for (int r = 0; r < world; ++r) {
        const std::string message = error_message(result.errors[r]);
        if (contains(message, "does not match") && contains(message, "root 0") && contains(message, "root 1")) {
          caught = true;
        }
      }
      EXPECT_TRUE(caught) << "no rank reported the disagreement on the root";
      // Whatever else happens, the two would-be roots must not both succeed.
      EXPECT_TRUE(result.errors[0] || result.errors[1]);
      for (int r = 0; r < world; ++r) {
        if (result.errors[r]) {
          EXPECT_TRUE(is_collective_error(result.errors[r])) << error_message(result.errors[r]);
        }
      }
    }
  }
}

// The other disagreement on the root cannot be told from a dead root: when no
// rank believes it is the root, every rank waits for data. They must all
// time out rather than hang or return.
TEST(Mismatch, BroadcastWithoutARoot) {
  Call c = allreduce_call();
  c.op = OpType::Broadcast;
  c.reduction.reset();
  c.timeout = milliseconds(200);
  std::vector<Call> calls(3, c);
  calls[0].root = 1;  // rank 0 believes rank 1 is the root; ranks 1 and 2 say rank 0
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(is_collective_error(result.errors[r])) << "rank " << r << ": " << error_message(result.errors[r]);
    EXPECT_TRUE(contains(error_message(result.errors[r]), "timed out")) << error_message(result.errors[r]);
  }
}

TEST(Mismatch, ReduceOp) {
  std::vector<Call> calls(2, allreduce_call());
  calls[1].reduction = tgpg::Reduction{ReduceOp::Max, false};
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  expect_mismatch(result, 0, 1, {"SUM", "MAX"});
  expect_mismatch(result, 1, 0, {"SUM", "MAX"});
}

// AVG and SUM reduce alike; only the division afterwards differs, so the
// header must still tell them apart.
TEST(Mismatch, SumAgainstAverage) {
  std::vector<Call> calls(2, allreduce_call());
  calls[0].reduction = tgpg::Reduction{ReduceOp::Sum, true};
  const GroupResult result = run_mixed(calls, kAlwaysRing);
  expect_mismatch(result, 1, 0, {"SUM", "AVG"});
}

TEST(Mismatch, SequenceNumber) {
  std::vector<Call> calls(2, allreduce_call());
  calls[1].seq = 2;
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  expect_mismatch(result, 0, 1, {"#1", "#2"});
}

TEST(Mismatch, ChunkSize) {
  std::vector<Call> calls(2, allreduce_call(40));
  calls[1].chunk_bytes = 32;
  const GroupResult result = run_mixed(calls, kAlwaysDirect);
  for (int r = 0; r < 2; ++r) {
    const std::string message = error_message(result.errors[r]);
    EXPECT_TRUE(is_collective_error(result.errors[r])) << message;
    EXPECT_TRUE(contains(message, "chunk size")) << message;
  }
}

// direct_max_bytes must be equal on all ranks (README), and nothing in a
// frame header says which path a rank took. Whatever the ranks then do, none
// may return a wrong result as if it were right.
TEST(Mismatch, DirectLimitNeverGivesASilentlyWrongResult) {
  for (int world = 2; world <= 3; ++world) {
    for (int odd_one = 0; odd_one < world; ++odd_one) {
      for (bool odd_one_direct : {true, false}) {
        // Segments of whole chunks, so that the offsets and sizes that
        // frames carry line up between the two paths.
        const uint64_t count = 8 * static_cast<uint64_t>(world);
        SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(odd_one) +
                     (odd_one_direct ? " alone goes direct" : " alone takes the ring"));
        Call c = allreduce_call(count);
        const std::vector<Call> calls(world, c);
        std::vector<std::vector<std::byte>> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(make_input(DType::Float32, ReduceOp::Sum, 17 + r, c.count));
        std::vector<std::vector<std::byte>> bufs = inputs;
        std::vector<std::byte*> data;
        for (auto& b : bufs) data.push_back(b.data());
        const GroupResult result = run_group(calls, {}, [&](tgpg::Collective& col, int rank) {
          const bool direct = (rank == odd_one) == odd_one_direct;
          tgpg::allreduce(col, data[rank], direct ? kAlwaysDirect : kAlwaysRing);
        });
        std::vector<const std::byte*> in;
        for (const auto& i : inputs) in.push_back(i.data());
        for (int r = 0; r < world; ++r) {
          if (result.errors[r]) continue;
          EXPECT_TRUE(matches_reduction(DType::Float32, ReduceOp::Sum, in, bufs[r].data(), c.count))
              << "rank " << r << " returned without an error, but with a wrong result";
        }
      }
    }
  }
}

TEST(Failure, AbortingPeerMakesOthersThrowAtOnce) {
  const int world = 3;
  std::vector<Call> calls(world, allreduce_call());
  for (auto& c : calls) c.timeout = milliseconds(20000);
  Buffers buffers(world);
  MemoryNetwork network(world);
  const auto start = Clock::now();
  auto errors = run_on_ranks(world, [&](int rank) {
    if (rank == 2) {
      network.messenger(rank).abort_peers("out of memory");
      return;
    }
    tgpg::Collective c = make_collective(network.messenger(rank), rank, world, calls[rank]);
    tgpg::allreduce(c, buffers.data[rank], kAlwaysDirect);
  });
  EXPECT_LT(Clock::now() - start, milliseconds(5000)) << "the peers waited for their timeout";
  for (int r = 0; r < 2; ++r) {
    const std::string message = error_message(errors[r]);
    ASSERT_TRUE(is_collective_error(errors[r])) << "rank " << r << ": '" << message << "'";
    EXPECT_TRUE(contains(message, "rank 2 failed")) << message;
    EXPECT_TRUE(contains(message, "out of memory")) << message;
    EXPECT_TRUE(contains(message, "allreduce")) << message;
  }
}

TEST(Failure, SilentPeerTimesOutNamingOpAndPeer) {
  const int world = 2;
  Call c = allreduce_call();
  c.timeout = milliseconds(200);
  Buffers buffers(world);
  MemoryNetwork network(world);
  const auto start = Clock::now();
  auto errors = run_on_ranks(world, [&](int rank) {
    if (rank == 1) return;  // never calls the collective
    tgpg::Collective col = make_collective(network.messenger(rank), rank, world, c);
    tgpg::allreduce(col, buffers.data[rank], kAlwaysDirect);
  });
  const auto elapsed = Clock::now() - start;
  const std::string message = error_message(errors[0]);
  ASSERT_TRUE(is_collective_error(errors[0])) << "'" << message << "'";
  EXPECT_TRUE(contains(message, "allreduce")) << message;
  EXPECT_TRUE(contains(message, "rank 1")) << message;
  EXPECT_TRUE(contains(message, "timed out")) << message;
  EXPECT_TRUE(contains(message, "200 ms")) << message;
  EXPECT_GE(elapsed, milliseconds(200));
  EXPECT_LT(elapsed, milliseconds(5000));
}

// A payload that the transport never releases keeps the caller from reusing
// its buffer; past the deadline that must become an error, not a hang.
TEST(Failure, UnreleasedSendsTimeOut) {
  const int world = 2;
  Call c = allreduce_call();
  c.op = OpType::Gather;
  c.root = 1;
  c.reduction.reset();
  c.timeout = milliseconds(200);
  MemoryOptions zero_copy;
  zero_copy.zero_copy = true;
  MemoryNetwork network(world, zero_copy);
  Buffers buffers(world);
  tgpg::Collective col = make_collective(network.messenger(0), 0, world, c);
  tgpg::gather(col, buffers.data[0], nullptr);  // rank 1 never takes the frames
  const auto start = Clock::now();
  try {
    col.wait_sends_released();
    FAIL() << "wait_sends_released returned although the payloads were never released";
  } catch (const tgpg::CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), "gather")) << e.what();
    EXPECT_TRUE(contains(e.what(), "timed out")) << e.what();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

TEST(Mismatch, MessageTagAndSize) {
  struct Case {
    int64_t send_tag, recv_tag;
    uint64_t send_count, recv_count;
    std::vector<std::string> details;
  };
  for (const Case& k : {Case{1, 2, 24, 24, {"tag 1", "tag 2"}}, Case{0, 0, 24, 25, {"24 elements", "25 elements"}}}) {
    std::vector<Call> calls(2, allreduce_call(k.send_count));
    for (Call& c : calls) {
      c.op = OpType::PointToPoint;
      c.reduction.reset();
    }
    calls[1].count = k.recv_count;
    Buffers buffers(2);
    const GroupResult result = run_group(calls, {}, [&](tgpg::Collective& c, int rank) {
      c.use_tag(rank == 0 ? k.send_tag : k.recv_tag);
      if (rank == 0) {
        tgpg::send_message(c, 1, buffers.data[0]);
      } else {
        tgpg::recv_message(c, 0, buffers.data[1]);
      }
    });
    const std::string message = error_message(result.errors.at(1));
    ASSERT_TRUE(is_collective_error(result.errors[1])) << message;
    EXPECT_TRUE(contains(message, "rank 0") && contains(message, "rank 1")) << message;
    for (const auto& d : k.details) EXPECT_TRUE(contains(message, d)) << "'" << d << "' missing from: " << message;
  }
}

TEST(Mismatch, AlltoallvSplits) {
  // Rank 0 sends rank 1 three elements; rank 1 expects two.
  std::vector<Call> calls(2, allreduce_call(4));
  for (Call& c : calls) {
    c.op = OpType::Alltoall;
    c.reduction.reset();
  }
  const std::vector<std::vector<tgpg::Block>> send{{{0, 1}, {1, 3}}, {{0, 2}, {2, 2}}};
  const std::vector<std::vector<tgpg::Block>> recv{{{0, 1}, {1, 2}}, {{0, 2}, {2, 2}}};
  Buffers buffers(2);
  const GroupResult result = run_group(calls, {}, [&](tgpg::Collective& c, int rank) {
    tgpg::alltoallv(c, buffers.data[rank], send[rank], buffers.data[rank] + 1024, recv[rank]);
  });
  expect_mismatch(result, 1, 0, {"3 elements", "2 elements", "input split 1", "output split 0"});
}

}  // namespace
}  // namespace tgpg_test
