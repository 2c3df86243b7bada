// Every collective of csrc/algorithms/collectives.h at world sizes 1..8 over the
// in-memory transport, checked against results computed here.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <thread>

#include "algorithms/collectives.h"
#include "group_run.h"
#include "rank_threads.h"
#include "reference.h"

namespace tgpg_test {
namespace {

using tgpg::DType;
using tgpg::OpType;
using tgpg::ReduceOp;

constexpr size_t kAlwaysDirect = std::numeric_limits<size_t>::max();
constexpr size_t kAlwaysRing = 0;

struct ReductionCase {
  DType dtype;
  ReduceOp op;
  bool average = false;
};

// Every op on float32 and int64, the ops that half precision supports, and
// narrow integers, so that element sizes 1, 2, 4 and 8 all occur; unsigned
// ones where signedness matters (MIN, MAX) or a narrow product could overflow
// an int.
const std::vector<ReductionCase>& reduction_cases() {
  static const std::vector<ReductionCase> cases = {
      {DType::Float32, ReduceOp::Sum},      {DType::Float32, ReduceOp::Product},
      {DType::Float32, ReduceOp::Min},      {DType::Float32, ReduceOp::Max},
      {DType::Float32, ReduceOp::Sum, /*average=*/true},
      {DType::Int64, ReduceOp::Sum},        {DType::Int64, ReduceOp::Product},
      {DType::Int64, ReduceOp::Min},        {DType::Int64, ReduceOp::Max},
      {DType::Int64, ReduceOp::BitAnd},     {DType::Int64, ReduceOp::BitOr},
      {DType::Int64, ReduceOp::BitXor},     {DType::Float16, ReduceOp::Sum},
      {DType::Float16, ReduceOp::Product},  {DType::Float16, ReduceOp::Min},
      {DType::Float16, ReduceOp::Max},      {DType::BFloat16, ReduceOp::Sum},
      {DType::BFloat16, ReduceOp::Product}, {DType::BFloat16, ReduceOp::Min},
      {DType::BFloat16, ReduceOp::Max},     {DType::Int32, ReduceOp::Sum},
      {DType::UInt8, ReduceOp::Max},        {DType::UInt16, ReduceOp::Product},
      {DType::UInt32, ReduceOp::Min},       {DType::UInt64, ReduceOp::Max},
      {DType::UInt64, ReduceOp::Min},       {DType::UInt64, ReduceOp::Sum},
  };
  return cases;
}

// Collectives that only move data care about the element size alone; complex128's is 16.
const DType kMoveDtypes[] = {DType::Float32, DType::Int64, DType::Float16, DType::UInt8, DType::Complex128};

// One element, fewer elements than ranks, and sizes that divide neither by
// the world size nor by the chunk sizes used here. Empty buffers have tests
// of their own (ZeroElements below).
std::vector<uint64_t> counts_for(int world) {
  const auto w = static_cast<uint64_t>(world);
  std::set<uint64_t> counts = {1, w + 1, 2 * w + 3, 37, 203};
  if (w > 1) counts.insert(w - 1);
  return {counts.begin(), counts.end()};
}

uint64_t seed_of(int rank, size_t case_index) { return static_cast<uint64_t>(rank) * 100003 + case_index; }

std::vector<const std::byte*> pointers(const std::vector<std::vector<std::byte>>& buffers, size_t offset = 0) {
  std::vector<const std::byte*> out;
  for (const auto& b : buffers) out.push_back(b.data() + offset);
  return out;
}

// The rank threads only ever see these raw pointers, taken before they start,
// so that the vectors themselves stay out of the race analysis.
std::vector<std::byte*> mutable_pointers(std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::byte*> out;
  for (auto& b : buffers) out.push_back(b.data());
  return out;
}

class Collectives : public ::testing::TestWithParam<int> {
 public:
  int world() const { return GetParam(); }

  // A call of the next chunk size in turn: one element per chunk (even where
  // chunk_bytes is smaller than an element), sizes that are not a multiple of
  // every element size, and several elements.
  Call call(OpType op, DType dtype, uint64_t count) {
    static const size_t chunk_sizes[] = {8, 12, 64, 1, 24};
    Call c;
    c.op = op;
    c.dtype = dtype;
    c.count = count;
    c.chunk_bytes = chunk_sizes[chunk_index_++ % (sizeof(chunk_sizes) / sizeof(chunk_sizes[0]))];
    return c;
  }

  // Runs one collective on every rank over the next transport variant in turn,
  // and checks that every rank returned and that no frame was left unread.
  void run_ok(const Call& c, const std::function<void(tgpg::Collective&, int rank)>& body) {
    const MemoryOptions options = transport_variant(transport_index_++);
    SCOPED_TRACE(describe(options));
    GroupResult result = run_group(std::vector<Call>(world(), c), options, body);
    for (int rank = 0; rank < world(); ++rank) {
      ASSERT_FALSE(result.errors[rank]) << "rank " << rank << ": " << error_message(result.errors[rank]);
    }
    EXPECT_EQ(result.frames_left, 0u) << "frames were sent that no rank received";
  }

  void check_allreduce(OpType op_type, size_t direct_max_bytes, const tgpg::HostLayout& hosts = {});
  void check_broadcast(size_t direct_max_bytes);

 private:
  size_t transport_index_ = 0;
  size_t chunk_index_ = 0;
};

std::string world_name(const ::testing::TestParamInfo<int>& info) { return "world" + std::to_string(info.param); }

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives, ::testing::Range(1, 9), world_name);

void Collectives::check_allreduce(OpType op_type, size_t direct_max_bytes, const tgpg::HostLayout& hosts) {
  for (size_t case_index = 0; case_index < reduction_cases().size(); ++case_index) {
    const ReductionCase& rc = reduction_cases()[case_index];
    for (uint64_t count : counts_for(world())) {
      Call c = call(op_type, rc.dtype, count);
      c.reduction = tgpg::Reduction{rc.op, rc.average};
      SCOPED_TRACE(describe(c));
      std::vector<std::vector<std::byte>> inputs;
      for (int r = 0; r < world(); ++r) inputs.push_back(make_input(rc.dtype, rc.op, seed_of(r, case_index), count));
      std::vector<std::vector<std::byte>> bufs = inputs;
      const auto data = mutable_pointers(bufs);
      ASSERT_NO_FATAL_FAILURE(
          run_ok(c, [&](tgpg::Collective& col, int rank) { tgpg::allreduce(col, data[rank], direct_max_bytes, hosts); }));
      for (int r = 0; r < world(); ++r) {
        // AVG is SUM here: the backend divides the final result.
        ASSERT_TRUE(matches_reduction(rc.dtype, rc.op, pointers(inputs), bufs[r].data(), count)) << "on rank " << r;
        // Every rank must hold the very same bits, or replicas drift apart.
        ASSERT_TRUE(bufs[r] == bufs[0]) << "rank " << r << " holds other bits than rank 0";
      }
    }
  }
}

TEST_P(Collectives, AllreduceDirect) { check_allreduce(OpType::Allreduce, kAlwaysDirect); }

// With no direct limit, every count of at least one element per rank takes the ring.
TEST_P(Collectives, AllreduceRing) { check_allreduce(OpType::Allreduce, kAlwaysRing); }

struct NamedLayout {
  std::string name;
  tgpg::HostLayout layout;
};

// The ranks spread over hosts in blocks and round robin (so that a host's ranks
// are not neighbours in rank order), for every split into at least two hosts of
// at least two ranks; and hosts of unequal sizes, where the flat ring takes over.
std::vector<NamedLayout> layouts_for(int world) {
  std::vector<NamedLayout> layouts;
  for (int hosts = 2; hosts * 2 <= world; ++hosts) {
    if (world % hosts != 0) continue;
    std::vector<std::string> blocks;
    std::vector<std::string> round_robin;
    for (int r = 0; r < world; ++r) {
      blocks.push_back("host" + std::to_string(r / (world / hosts)));
      round_robin.push_back("host" + std::to_string(r % hosts));
    }
    layouts.push_back({std::to_string(hosts) + " hosts in blocks", tgpg::HostLayout(blocks)});
    layouts.push_back({std::to_string(hosts) + " hosts round robin", tgpg::HostLayout(round_robin)});
  }
  if (world >= 3) {
    std::vector<std::string> uneven(static_cast<size_t>(world), "big");
    uneven.back() = "small";
    layouts.push_back({"hosts of unequal sizes", tgpg::HostLayout(uneven)});
  }
  return layouts;
}

TEST_P(Collectives, AllreduceTwoLevel) {
  for (const NamedLayout& named : layouts_for(world())) {
    SCOPED_TRACE(named.name);
    EXPECT_EQ(named.layout.two_level(), named.name != "hosts of unequal sizes");
    check_allreduce(OpType::Allreduce, kAlwaysRing, named.layout);
  }
}

TEST(HostLayout, NumbersHostsByTheirLowestRank) {
  const tgpg::HostLayout layout({"b", "a", "b", "a", "c", "c"});
  EXPECT_TRUE(layout.two_level());
  EXPECT_EQ(layout.host_of(0), 0);
  EXPECT_EQ(layout.host_of(1), 1);
  EXPECT_EQ(layout.host_of(4), 2);
  EXPECT_EQ(layout.local_ranks(3), (std::vector<int>{1, 3}));
  EXPECT_EQ(layout.position_on_host(3), 1);
  EXPECT_EQ(layout.counterparts(3), (std::vector<int>{2, 3, 5}));
  EXPECT_EQ(layout.counterparts(4), (std::vector<int>{0, 1, 4}));
  EXPECT_FALSE(tgpg::HostLayout({"a", "a"}).two_level()) << "one host";
  EXPECT_FALSE(tgpg::HostLayout({"a", "b", "c"}).two_level()) << "one rank per host";
  EXPECT_FALSE(tgpg::HostLayout({"a", "a", "b", "b", "b"}).two_level()) << "unequal hosts";
  EXPECT_FALSE(tgpg::HostLayout().two_level());
}

// reduce runs the allreduce algorithm under its own op type.
TEST_P(Collectives, ReduceRunsAllreduce) { check_allreduce(OpType::Reduce, 40); }

void Collectives::check_broadcast(size_t direct_max_bytes) {
  size_t case_index = 0;
  for (int root = 0; root < world(); ++root) {
    for (uint64_t count : counts_for(world())) {
      const DType dtype = kMoveDtypes[case_index++ % std::size(kMoveDtypes)];
      Call c = call(OpType::Broadcast, dtype, count);
      c.root = static_cast<uint32_t>(root);
      SCOPED_TRACE(describe(c));
      const size_t bytes = count * tgpg::element_size(dtype);
      std::vector<std::vector<std::byte>> bufs;
      for (int r = 0; r < world(); ++r) bufs.push_back(make_bytes(seed_of(r, case_index), bytes));
      const std::vector<std::byte> expected = bufs[root];
      const auto data = mutable_pointers(bufs);
      ASSERT_NO_FATAL_FAILURE(
          run_ok(c, [&](tgpg::Collective& col, int rank) { tgpg::broadcast(col, data[rank], direct_max_bytes); }));
      for (int r = 0; r < world(); ++r) ASSERT_TRUE(bufs[r] == expected) << "rank " << r << " differs from the root";
    }
  }
}

TEST_P(Collectives, BroadcastDirectFromEveryRoot) { check_broadcast(kAlwaysDirect); }
TEST_P(Collectives, BroadcastRingFromEveryRoot) { check_broadcast(kAlwaysRing); }

TEST_P(Collectives, Allgather) {
  size_t case_index = 0;
  for (DType dtype : kMoveDtypes) {
    for (uint64_t count : counts_for(world())) {
      Call c = call(OpType::Allgather, dtype, count);
      SCOPED_TRACE(describe(c));
      const size_t block = count * tgpg::element_size(dtype);
      std::vector<std::vector<std::byte>> inputs, outs;
      for (int r = 0; r < world(); ++r) {
        inputs.push_back(make_bytes(seed_of(r, ++case_index), block));
        // The other blocks start out as junk that must not show through.
        outs.push_back(make_bytes(seed_of(r, 1000 + case_index), block * world()));
        std::copy(inputs[r].begin(), inputs[r].end(), outs[r].begin() + r * block);
      }
      const auto data = mutable_pointers(outs);
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) { tgpg::allgather(col, data[rank]); }));
      for (int r = 0; r < world(); ++r) {
        for (int b = 0; b < world(); ++b) {
          ASSERT_EQ(0, std::memcmp(outs[r].data() + b * block, inputs[b].data(), block))
              << "rank " << r << ", block " << b;
        }
      }
    }
  }
}

TEST_P(Collectives, ReduceScatter) {
  for (size_t case_index = 0; case_index < reduction_cases().size(); ++case_index) {
    const ReductionCase& rc = reduction_cases()[case_index];
    for (uint64_t count : counts_for(world())) {
      Call c = call(OpType::ReduceScatter, rc.dtype, count);
      c.reduction = tgpg::Reduction{rc.op, rc.average};
      SCOPED_TRACE(describe(c));
      const size_t block = count * tgpg::element_size(rc.dtype);
      std::vector<std::vector<std::byte>> inputs;
      for (int r = 0; r < world(); ++r) {
        inputs.push_back(make_input(rc.dtype, rc.op, seed_of(r, case_index), count * world()));
      }
      std::vector<std::vector<std::byte>> bufs = inputs;
      const auto data = mutable_pointers(bufs);
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) { tgpg::reduce_scatter(col, data[rank]); }));
      for (int r = 0; r < world(); ++r) {
        ASSERT_TRUE(matches_reduction(rc.dtype, rc.op, pointers(inputs, r * block), bufs[r].data() + r * block, count))
            << "block " << r << " on rank " << r;
      }
    }
  }
}

TEST_P(Collectives, GatherToEveryRoot) {
  size_t case_index = 0;
  for (int root = 0; root < world(); ++root) {
    for (uint64_t count : counts_for(world())) {
      const DType dtype = kMoveDtypes[case_index++ % std::size(kMoveDtypes)];
      Call c = call(OpType::Gather, dtype, count);
      c.root = static_cast<uint32_t>(root);
      SCOPED_TRACE(describe(c));
      const size_t block = count * tgpg::element_size(dtype);
      std::vector<std::vector<std::byte>> inputs;
      for (int r = 0; r < world(); ++r) inputs.push_back(make_bytes(seed_of(r, case_index), block));
      std::vector<std::byte> out = make_bytes(seed_of(root, 1000 + case_index), block * world());
      const auto in = pointers(inputs);
      std::byte* out_data = out.data();
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) {
        // As in the backend, only the root has an output buffer.
        tgpg::gather(col, in[rank], rank == root ? out_data : nullptr);
      }));
      for (int b = 0; b < world(); ++b) {
        ASSERT_EQ(0, std::memcmp(out.data() + b * block, inputs[b].data(), block)) << "block " << b;
      }
    }
  }
}

TEST_P(Collectives, ScatterFromEveryRoot) {
  size_t case_index = 0;
  for (int root = 0; root < world(); ++root) {
    for (uint64_t count : counts_for(world())) {
      const DType dtype = kMoveDtypes[case_index++ % std::size(kMoveDtypes)];
      Call c = call(OpType::Scatter, dtype, count);
      c.root = static_cast<uint32_t>(root);
      SCOPED_TRACE(describe(c));
      const size_t block = count * tgpg::element_size(dtype);
      const std::vector<std::byte> in = make_bytes(seed_of(root, case_index), block * world());
      std::vector<std::vector<std::byte>> outs;
      for (int r = 0; r < world(); ++r) outs.push_back(make_bytes(seed_of(r, 1000 + case_index), block));
      const std::byte* in_data = in.data();
      const auto out = mutable_pointers(outs);
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) {
        // As in the backend, only the root has an input buffer.
        tgpg::scatter(col, rank == root ? in_data : nullptr, out[rank]);
      }));
      for (int r = 0; r < world(); ++r) {
        ASSERT_EQ(0, std::memcmp(outs[r].data(), in.data() + r * block, block)) << "rank " << r;
      }
    }
  }
}

TEST_P(Collectives, Alltoall) {
  size_t case_index = 0;
  for (DType dtype : kMoveDtypes) {
    for (uint64_t count : counts_for(world())) {
      Call c = call(OpType::Alltoall, dtype, count);
      SCOPED_TRACE(describe(c));
      const size_t block = count * tgpg::element_size(dtype);
      std::vector<std::vector<std::byte>> inputs, outs;
      for (int r = 0; r < world(); ++r) {
        inputs.push_back(make_bytes(seed_of(r, ++case_index), block * world()));
        outs.push_back(make_bytes(seed_of(r, 1000 + case_index), block * world()));
      }
      const auto in = pointers(inputs);
      const auto out = mutable_pointers(outs);
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) { tgpg::alltoall(col, in[rank], out[rank]); }));
      for (int i = 0; i < world(); ++i) {
        for (int j = 0; j < world(); ++j) {
          ASSERT_EQ(0, std::memcmp(outs[j].data() + i * block, inputs[i].data() + j * block, block))
              << "block " << j << " of rank " << i << " in block " << i << " of rank " << j;
        }
      }
    }
  }
}

// Rank i sends (2i + 3j) % 4 * unit elements to rank j: uneven, with empty blocks.
uint64_t uneven_block(int src, int dst, uint64_t unit) { return static_cast<uint64_t>((2 * src + 3 * dst) % 4) * unit; }

TEST_P(Collectives, AlltoallvUnevenBlocks) {
  size_t case_index = 0;
  for (DType dtype : kMoveDtypes) {
    for (uint64_t unit : {uint64_t{1}, uint64_t{7}}) {
      const size_t esize = tgpg::element_size(dtype);
      std::vector<std::vector<tgpg::Block>> send(world()), recv(world());
      std::vector<std::vector<std::byte>> inputs, outs;
      for (int r = 0; r < world(); ++r) {
        uint64_t sent = 0, received = 0;
        for (int peer = 0; peer < world(); ++peer) {
          send[r].push_back({sent, uneven_block(r, peer, unit)});
          recv[r].push_back({received, uneven_block(peer, r, unit)});
          sent += send[r].back().count;
          received += recv[r].back().count;
        }
        inputs.push_back(make_bytes(seed_of(r, ++case_index), sent * esize));
        outs.push_back(make_bytes(seed_of(r, 1000 + case_index), received * esize));
      }
      Call c = call(OpType::Alltoall, dtype, 0);
      SCOPED_TRACE(describe(c) + " unit=" + std::to_string(unit));
      const auto in = pointers(inputs);
      const auto out = mutable_pointers(outs);
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) {
        tgpg::alltoallv(col, in[rank], send[rank], out[rank], recv[rank]);
      }));
      for (int i = 0; i < world(); ++i) {
        for (int j = 0; j < world(); ++j) {
          const size_t bytes = send[i][j].count * esize;
          ASSERT_EQ(bytes, recv[j][i].count * esize);
          if (bytes == 0) continue;
          ASSERT_EQ(0, std::memcmp(outs[j].data() + recv[j][i].offset * esize,
                                   inputs[i].data() + send[i][j].offset * esize, bytes))
              << "block for rank " << j << " of rank " << i;
        }
      }
    }
  }
}

TEST_P(Collectives, MessagesBetweenEveryPair) {
  for (DType dtype : kMoveDtypes) {
    for (uint64_t count : counts_for(world())) {
      Call c = call(OpType::PointToPoint, dtype, count);
      SCOPED_TRACE(describe(c));
      const size_t bytes = count * tgpg::element_size(dtype);
      // messages[src][dst], and what each rank received from each source.
      std::vector<std::vector<std::vector<std::byte>>> messages(world()), got(world());
      for (int src = 0; src < world(); ++src) {
        for (int dst = 0; dst < world(); ++dst) {
          messages[src].push_back(make_bytes(seed_of(src, 100 * dst + 7), bytes));
          got[src].push_back(std::vector<std::byte>(bytes));
        }
      }
      ASSERT_NO_FATAL_FAILURE(run_ok(c, [&](tgpg::Collective& col, int rank) {
        for (int dst = 0; dst < world(); ++dst) {
          if (dst != rank) tgpg::send_message(col, dst, messages[rank][dst].data());
        }
        for (int src = 0; src < world(); ++src) {
          if (src != rank) tgpg::recv_message(col, src, got[rank][src].data());
        }
      }));
      for (int dst = 0; dst < world(); ++dst) {
        for (int src = 0; src < world(); ++src) {
          if (src != dst) {
            ASSERT_TRUE(got[dst][src] == messages[src][dst]) << "from " << src << " to " << dst;
          }
        }
      }
    }
  }
}

TEST_P(Collectives, BarrierWaitsForTheLastRank) {
  for (int late = 0; late < world(); ++late) {
    std::vector<std::atomic<bool>> entered(world());
    std::atomic<int> early_exits{0};
    ASSERT_NO_FATAL_FAILURE(run_ok(call(OpType::Barrier, DType::UInt8, 0), [&](tgpg::Collective& col, int rank) {
      if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      entered[rank] = true;
      tgpg::barrier(col);
      for (int r = 0; r < world(); ++r) {
        if (!entered[r]) ++early_exits;
      }
    }));
    EXPECT_EQ(early_exits, 0) << "a rank left the barrier before rank " << late << " entered it";
  }
}

// Consecutive collectives share the queues between ranks; none may take
// another's frames.
TEST_P(Collectives, SeveralCollectivesInARow) {
  const uint64_t count = 2 * static_cast<uint64_t>(world()) + 1;
  const auto options = transport_variant(3);
  MemoryNetwork network(world(), options);
  std::vector<std::vector<std::byte>> inputs, bufs, gathered;
  for (int r = 0; r < world(); ++r) {
    inputs.push_back(make_input(DType::Float32, ReduceOp::Sum, seed_of(r, 1), count));
    gathered.push_back(std::vector<std::byte>(count * 4 * world()));
  }
  bufs = inputs;
  const auto data = mutable_pointers(bufs);
  const auto gather_out = mutable_pointers(gathered);
  const int w = world();
  auto errors = run_on_ranks(w, [&](int rank) {
    tgpg::Messenger& m = network.messenger(rank);
    uint64_t seq = 1;
    auto next = [&](OpType op, uint64_t n) {
      Call c;
      c.op = op;
      c.count = n;
      c.chunk_bytes = 12;
      c.seq = seq++;
      if (op == OpType::Allreduce) c.reduction = tgpg::Reduction{};
      return make_collective(m, rank, w, c);
    };
    {
      tgpg::Collective c = next(OpType::Barrier, 0);
      tgpg::barrier(c);
    }
    {
      tgpg::Collective c = next(OpType::Allreduce, count);
      tgpg::allreduce(c, data[rank], 0);
      c.wait_sends_released();
    }
    {
      tgpg::Collective c = next(OpType::Allgather, count);
      std::memcpy(gather_out[rank] + rank * count * 4, data[rank], count * 4);
      tgpg::allgather(c, gather_out[rank]);
      c.wait_sends_released();
    }
    {
      tgpg::Collective c = next(OpType::Barrier, 0);
      tgpg::barrier(c);
    }
  });
  for (int r = 0; r < w; ++r) ASSERT_FALSE(errors[r]) << "rank " << r << ": " << error_message(errors[r]);
  EXPECT_EQ(network.frames_in_flight(), 0u);
  for (int r = 0; r < w; ++r) {
    ASSERT_TRUE(matches_reduction(DType::Float32, ReduceOp::Sum, pointers(inputs), bufs[r].data(), count));
    for (int b = 0; b < w; ++b) {
      ASSERT_EQ(0, std::memcmp(gathered[r].data() + b * count * 4, bufs[0].data(), count * 4)) << "rank " << r;
    }
  }
}

// Buffers of 4 MiB and more are copied out of received chunks past the caches
// (copy_kernels.h). Odd sizes, odd chunks and split payloads give that copy
// unaligned heads and short tails in every chunk.
TEST(LargeBuffers, BroadcastAndAllgatherCopyPastTheCache) {
  constexpr int kWorld = 3;
  const uint64_t count = (uint64_t{4} << 20) + 5;
  for (size_t variant = 0; variant < 4; ++variant) {
    const MemoryOptions options = transport_variant(variant);
    SCOPED_TRACE(describe(options));
    Call c;
    c.dtype = DType::UInt8;
    c.count = count;
    c.chunk_bytes = (size_t{1} << 20) + 7;

    c.op = OpType::Broadcast;
    c.root = 1;
    std::vector<std::vector<std::byte>> bufs;
    for (int r = 0; r < kWorld; ++r) bufs.push_back(make_bytes(seed_of(r, variant), count));
    const std::vector<std::byte> expected = bufs[c.root];
    const auto data = mutable_pointers(bufs);
    GroupResult result = run_group(std::vector<Call>(kWorld, c), options, [&](tgpg::Collective& col, int rank) {
      tgpg::broadcast(col, data[rank], kAlwaysRing);
    });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_FALSE(result.errors[r]) << "broadcast, rank " << r << ": " << error_message(result.errors[r]);
      ASSERT_TRUE(bufs[r] == expected) << "broadcast: rank " << r << " differs from the root";
    }

    c.op = OpType::Allgather;
    c.root = 0;
    std::vector<std::vector<std::byte>> inputs, outs;
    for (int r = 0; r < kWorld; ++r) {
      inputs.push_back(make_bytes(seed_of(r, 10 + variant), count));
      outs.push_back(make_bytes(seed_of(r, 20 + variant), count * kWorld));
      std::copy(inputs[r].begin(), inputs[r].end(), outs[r].begin() + r * count);
    }
    const auto gathered = mutable_pointers(outs);
    result = run_group(std::vector<Call>(kWorld, c), options,
                       [&](tgpg::Collective& col, int rank) { tgpg::allgather(col, gathered[rank]); });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_FALSE(result.errors[r]) << "allgather, rank " << r << ": " << error_message(result.errors[r]);
      for (int b = 0; b < kWorld; ++b) {
        ASSERT_EQ(0, std::memcmp(outs[r].data() + b * count, inputs[b].data(), count))
            << "allgather: rank " << r << ", block " << b;
      }
    }
  }
}

// Zero-element tensors reach the algorithms with null data pointers (torch's
// CPU allocator returns null for zero bytes). Every collective must complete
// on every rank, exchange its headers and touch no memory.
TEST_P(Collectives, ZeroElementsWithNullBuffers) {
  const int w = world();
  auto run_all = [&](OpType op, uint32_t root, std::optional<tgpg::Reduction> reduction,
                     const std::function<void(tgpg::Collective&, int)>& body) {
    Call c = call(op, DType::Float32, 0);
    c.root = root;
    c.reduction = reduction;
    SCOPED_TRACE(describe(c));
    run_ok(c, body);
  };
  for (size_t direct : {kAlwaysDirect, kAlwaysRing}) {
    ASSERT_NO_FATAL_FAILURE(run_all(OpType::Allreduce, 0, tgpg::Reduction{},
                                    [&](tgpg::Collective& c, int) { tgpg::allreduce(c, nullptr, direct); }));
    for (int root = 0; root < w; ++root) {
      ASSERT_NO_FATAL_FAILURE(run_all(OpType::Broadcast, root, std::nullopt,
                                      [&](tgpg::Collective& c, int) { tgpg::broadcast(c, nullptr, direct); }));
    }
  }
  ASSERT_NO_FATAL_FAILURE(
      run_all(OpType::Allgather, 0, std::nullopt, [&](tgpg::Collective& c, int) { tgpg::allgather(c, nullptr); }));
  ASSERT_NO_FATAL_FAILURE(run_all(OpType::ReduceScatter, 0, tgpg::Reduction{},
                                  [&](tgpg::Collective& c, int) { tgpg::reduce_scatter(c, nullptr); }));
  ASSERT_NO_FATAL_FAILURE(
      run_all(OpType::Alltoall, 0, std::nullopt, [&](tgpg::Collective& c, int) { tgpg::alltoall(c, nullptr, nullptr); }));
  for (int root = 0; root < w; ++root) {
    ASSERT_NO_FATAL_FAILURE(
        run_all(OpType::Gather, root, std::nullopt, [&](tgpg::Collective& c, int) { tgpg::gather(c, nullptr, nullptr); }));
    ASSERT_NO_FATAL_FAILURE(run_all(OpType::Scatter, root, std::nullopt,
                                    [&](tgpg::Collective& c, int) { tgpg::scatter(c, nullptr, nullptr); }));
  }
}

}  // namespace
}  // namespace tgpg_test
