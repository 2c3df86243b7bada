// SegmentGroup: the collectives of ranks that share one segment, each rank a
// thread here with its own mapping of the file, against references computed
// apart: exact for integers, and every rank's bytes equal to every other's for
// floats; ranks that call different ops fail at once, naming each other; a
// peer that never comes times out, naming it; a failed group ends the wait.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/op_type.h"
#include "same_host/segment_group.h"

namespace tgpg_test {
namespace {

using tgpg::DType;
using tgpg::OpDescriptor;
using tgpg::OpType;
using tgpg::ReduceOp;
using tgpg::SegmentGroup;

constexpr uint64_t kSlotBytes = 64 << 10;  // small, so that ops of a few hundred KiB run in several rounds

tgpg::SegmentWait wait_for(std::chrono::milliseconds bound, std::function<std::string()> failure = nullptr) {
  return tgpg::SegmentWait{std::chrono::steady_clock::now() + bound, std::move(failure)};
}

// One group per test: rank 0 makes the segment, the others open it as peers do.
std::vector<std::unique_ptr<SegmentGroup>> make_group(uint32_t world, uint64_t slot_bytes = kSlotBytes) {
  tgpg::Segment first = tgpg::Segment::create(world, slot_bytes);
  const tgpg::SharedFileOffer offer = first.offer();
  std::vector<std::unique_ptr<SegmentGroup>> ranks;
  std::vector<tgpg::Segment> opened;
  for (uint32_t r = 1; r < world; ++r) opened.push_back(tgpg::Segment::open(offer, world, slot_bytes));
  ranks.push_back(std::make_unique<SegmentGroup>(std::move(first), 0));
  for (uint32_t r = 1; r < world; ++r) ranks.push_back(std::make_unique<SegmentGroup>(std::move(opened[r - 1]), r));
  return ranks;
}

// Runs `body(rank)` on one thread per rank; the exceptions each raised, by rank.
std::vector<std::string> run_ranks(uint32_t world, const std::function<void(uint32_t)>& body) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

OpDescriptor op(OpType type, uint64_t seq, DType dtype, uint64_t count, uint32_t root = 0, uint32_t reduction = 0) {
  OpDescriptor d;
  d.seq = seq;
  d.op = static_cast<uint32_t>(type);
  d.dtype = static_cast<uint32_t>(dtype);
  d.count = count;
  d.root = root;
  d.reduction = reduction;
  return d;
}

int64_t input_of(uint32_t rank, size_t i) { return static_cast<int64_t>((i * 7 + rank * 13) % 1000) - 500; }

class SegmentSizes : public ::testing::TestWithParam<std::tuple<uint32_t, size_t>> {};

TEST_P(SegmentSizes, AllreduceOfIntegersIsExact) {
  const auto [world, count] = GetParam();
  auto group = make_group(world);
  std::vector<std::vector<int64_t>> data(world, std::vector<int64_t>(count));
  for (uint32_t r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) data[r][i] = input_of(r, i);
  }
  // Three ops back to back: the buffer sets alternate under a rank that runs ahead.
  const auto errors = run_ranks(world, [&](uint32_t r) {
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      std::vector<int64_t> mine = data[r];
      group[r]->allreduce(reinterpret_cast<std::byte*>(mine.data()), count, DType::Int64, ReduceOp::Sum,
                          op(OpType::Allreduce, seq, DType::Int64, count, 0, 1), wait_for(std::chrono::seconds(20)));
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (uint32_t q = 0; q < world; ++q) want += input_of(q, i);
        if (mine[i] != want) throw std::runtime_error("element " + std::to_string(i) + " is wrong");
      }
    }
  });
  for (uint32_t r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST_P(SegmentSizes, AllreduceOfFloatsGivesEveryRankTheSameBytes) {
  const auto [world, count] = GetParam();
  auto group = make_group(world);
  std::vector<std::vector<float>> out(world, std::vector<float>(count));
  const auto errors = run_ranks(world, [&](uint32_t r) {
    for (size_t i = 0; i < count; ++i) out[r][i] = 0.1f * static_cast<float>(input_of(r, i)) + 1e-3f * r;
    group[r]->allreduce(reinterpret_cast<std::byte*>(out[r].data()), count, DType::Float32, ReduceOp::Sum,
                        op(OpType::Allreduce, 1, DType::Float32, count, 0, 1), wait_for(std::chrono::seconds(20)));
  });
  for (uint32_t r = 0; r < world; ++r) {
    EXPECT_EQ(errors[r], "");
    EXPECT_EQ(out[r], out[0]) << "rank " << r;  // the same values; memcmp may not take an empty vector's null
  }
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (uint32_t q = 0; q < world; ++q) want += 0.1 * static_cast<float>(input_of(q, i)) + 1e-3 * q;
    ASSERT_NEAR(out[0][i], want, 1e-3) << i;
  }
}

TEST_P(SegmentSizes, BroadcastAllgatherAndReduceScatterMoveEveryByte) {
  const auto [world, count] = GetParam();
  auto group = make_group(world);
  const uint32_t root = world - 1;
  const auto errors = run_ranks(world, [&](uint32_t r) {
    // broadcast
    std::vector<int64_t> b(count);
    for (size_t i = 0; i < count; ++i) b[i] = input_of(r, i);
    group[r]->broadcast(reinterpret_cast<std::byte*>(b.data()), count * 8, root,
                        op(OpType::Broadcast, 1, DType::Int64, count, root), wait_for(std::chrono::seconds(20)));
    for (size_t i = 0; i < count; ++i) {
      if (b[i] != input_of(root, i)) throw std::runtime_error("broadcast element " + std::to_string(i));
    }
    // allgather
    std::vector<int64_t> in(count), gathered(count * world);
    for (size_t i = 0; i < count; ++i) in[i] = input_of(r, i);
    group[r]->allgather(reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(gathered.data()),
                        count * 8, op(OpType::Allgather, 2, DType::Int64, count), wait_for(std::chrono::seconds(20)));
    for (uint32_t q = 0; q < world; ++q) {
      for (size_t i = 0; i < count; ++i) {
        if (gathered[q * count + i] != input_of(q, i)) throw std::runtime_error("allgather block " + std::to_string(q));
      }
    }
    // reduce_scatter: block q of rank r's input is input_of(r + q, i)
    std::vector<int64_t> blocks(count * world), result(count);
    for (uint32_t q = 0; q < world; ++q) {
      for (size_t i = 0; i < count; ++i) blocks[q * count + i] = input_of(r + q, i);
    }
    group[r]->reduce_scatter(reinterpret_cast<const std::byte*>(blocks.data()), reinterpret_cast<std::byte*>(result.data()),
                             count, DType::Int64, ReduceOp::Max, op(OpType::ReduceScatter, 3, DType::Int64, count, 0, 4),
                             wait_for(std::chrono::seconds(20)));
    for (size_t i = 0; i < count; ++i) {
      int64_t want = input_of(r, i);
      for (uint32_t q = 0; q < world; ++q) want = std::max(want, input_of(q + r, i));
      if (result[i] != want) throw std::runtime_error("reduce_scatter element " + std::to_string(i));
    }
    group[r]->barrier(op(OpType::Barrier, 4, DType::Float32, 0), wait_for(std::chrono::seconds(20)));
  });
  for (uint32_t r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// No elements, one, a round's worth, more than the reduce-everything bound, and several rounds.
INSTANTIATE_TEST_SUITE_P(Worlds, SegmentSizes,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u, 4u),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{1000}, size_t{8192},
                                                              size_t{100003})));

TEST(Segment, RanksThatCallDifferentSizesFailAtOnceNamingEachOther) {
  auto group = make_group(2);
  const auto errors = run_ranks(2, [&](uint32_t r) {
    const size_t count = r == 0 ? 10 : 20;
    std::vector<float> data(count, 1.0f);
    group[r]->allreduce(reinterpret_cast<std::byte*>(data.data()), count, DType::Float32, ReduceOp::Sum,
                        op(OpType::Allreduce, 1, DType::Float32, count, 0, 1), wait_for(std::chrono::seconds(20)));
  });
  EXPECT_NE(errors[0].find("allreduce #1 (float32, 10 elements, SUM) on rank 0 does not match rank 1"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("on rank 1 does not match rank 0, which is running allreduce #1 (float32, 10 elements"),
            std::string::npos)
      << errors[1];
}

TEST(Segment, APeerOnTheNetworkLinksForTheSameOpFailsItAtOnce) {
  auto group = make_group(2);
  const auto started = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](uint32_t r) {
    const OpDescriptor d = op(OpType::Broadcast, 1, DType::Float32, 4);
    if (r == 1) {
      group[r]->announce_elsewhere(d);
      return;
    }
    std::vector<float> data(4);
    group[r]->broadcast(reinterpret_cast<std::byte*>(data.data()), 16, 0, d, wait_for(std::chrono::seconds(30)));
  });
  EXPECT_NE(errors[0].find("runs in the ranks' shared memory segment, but rank 1 runs broadcast #1"), std::string::npos)
      << errors[0];
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

TEST(Segment, APeerThatNeverComesTimesOutNamingIt) {
  auto group = make_group(3);
  const auto started = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](uint32_t r) {  // rank 2 never runs
    group[r]->barrier(op(OpType::Barrier, 1, DType::Float32, 0), wait_for(std::chrono::milliseconds(300)));
  });
  const auto took = std::chrono::steady_clock::now() - started;
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("timed out waiting for rank 2"), std::string::npos) << errors[r];
  }
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(Segment, AFailedGroupEndsTheWaitWithItsReason) {
  auto group = make_group(2);
  std::atomic<bool> failed{false};
  std::thread fail_soon([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    failed.store(true);
  });
  std::string error;
  try {
    group[0]->barrier(op(OpType::Barrier, 1, DType::Float32, 0),
                      wait_for(std::chrono::seconds(30), [&] { return failed.load() ? "rank 1 died" : ""; }));
  } catch (const tgpg::CollectiveError& e) {
    error = e.what();
  }
  fail_soon.join();
  // The group's reason, after the op that met it, as a link's failure reads.
  EXPECT_EQ(error, "barrier #1 (float32, 0 elements) on rank 0 failed: rank 1 died");
}

}  // namespace
}  // namespace tgpg_test
