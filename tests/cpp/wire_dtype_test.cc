// Float32 collectives that narrow their chunks to bfloat16 or float16 on links
// between hosts (Collective::use_wire_dtype, TORCH_GRPC_PG_WIRE_DTYPE): every
// rank must end with the same bits, the error against a float64 reference must
// stay within what the roundings allow, and links inside a host, other dtypes
// and groups on one host must not change at all.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/collectives.h"
#include "algorithms/host_layout.h"
#include "algorithms/wire_kernels.h"
#include "elements.h"
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
const DType kWires[] = {DType::BFloat16, DType::Float16};

float get(const std::vector<std::byte>& buf, size_t i) {
  float v;
  std::memcpy(&v, buf.data() + 4 * i, 4);
  return v;
}

// Values of either sign from 2^-6 to 2^7: normal in float16 too, and their
// sums over eight ranks stay far below its largest value.
std::vector<std::byte> floats(uint64_t seed, size_t count) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::uniform_int_distribution<int> exponent(-5, 7);
  std::vector<std::byte> out(4 * count);
  for (size_t i = 0; i < count; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

std::vector<std::byte> rounded(std::vector<std::byte> buf, DType wire) {
  tgpg::round_through_wire(buf.data(), buf.size() / 4, wire);
  return buf;
}

struct Layout {
  std::string name;
  std::vector<std::string> hosts;  // by rank
};

// Every way to put the ranks on at least two hosts that the schedules treat
// differently: one rank per host (flat ring, every link narrows), hosts of
// equal sizes in blocks and round robin (two levels), and unequal hosts (flat
// ring whose links partly narrow).
std::vector<Layout> spanning_layouts(int world) {
  std::vector<Layout> layouts;
  for (int hosts = 2; hosts <= world; ++hosts) {
    if (world % hosts != 0) continue;
    Layout blocks{std::to_string(hosts) + " hosts in blocks", {}};
    Layout round_robin{std::to_string(hosts) + " hosts round robin", {}};
    for (int r = 0; r < world; ++r) {
      blocks.hosts.push_back("h" + std::to_string(r / (world / hosts)));
      round_robin.hosts.push_back("h" + std::to_string(r % hosts));
    }
    layouts.push_back(blocks);
    if (hosts < world) layouts.push_back(round_robin);
  }
  if (world >= 3) {
    Layout uneven{"hosts of unequal sizes", std::vector<std::string>(static_cast<size_t>(world), "big")};
    uneven.hosts.back() = "small";
    layouts.push_back(uneven);
  }
  return layouts;
}

std::vector<bool> remote_of(const std::vector<std::string>& hosts, int rank) {
  std::vector<bool> remote;
  for (const auto& h : hosts) remote.push_back(h != hosts[static_cast<size_t>(rank)]);
  return remote;
}

std::vector<Call> calls_for(const Call& base, const std::vector<std::string>& hosts, DType wire) {
  std::vector<Call> calls;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    Call c = base;
    c.wire = wire;
    c.remote = remote_of(hosts, r);
    calls.push_back(c);
  }
  return calls;
}

std::vector<std::byte*> pointers(std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::byte*> out;
  for (auto& b : buffers) out.push_back(b.data());
  return out;
}

void expect_all_returned(const GroupResult& result) {
  for (size_t r = 0; r < result.errors.size(); ++r) {
    ASSERT_FALSE(result.errors[r]) << "rank " << r << ": " << error_message(result.errors[r]);
  }
  EXPECT_EQ(result.frames_left, 0u);
}

bool representable(float v, DType wire) {
  std::vector<std::byte> one(4);
  std::memcpy(one.data(), &v, 4);
  tgpg::round_through_wire(one.data(), 1, wire);
  return std::memcmp(one.data(), &v, 4) == 0;
}

// How far a sum of `world` float32 values, rounded through `wire` at most
// `roundings` times along the way (each partial sum is at most the sum of
// magnitudes), may land from the exact sum: each rounding is off by at most
// the wire dtype's unit roundoff of the value rounded, each float32 addition
// by float32's. Float16 also has an absolute floor, half its smallest
// subnormal, for partial sums that cancel to tiny values.
double error_bound(double magnitude_sum, int roundings, int world, DType wire) {
  const double u = unit_roundoff(wire);
  const double floor = wire == DType::Float16 ? std::ldexp(1.0, -25) : 0.0;
  return 1.001 * ((roundings * u + world * unit_roundoff(DType::Float32)) * magnitude_sum + roundings * floor);
}

class WireDtype : public ::testing::TestWithParam<int> {
 public:
  int world() const { return GetParam(); }
  Call call(OpType op, uint64_t count) {
    static const size_t chunk_sizes[] = {8, 12, 64, 24, 4};
    Call c;
    c.op = op;
    c.count = count;
    c.chunk_bytes = chunk_sizes[chunk_index_++ % std::size(chunk_sizes)];
    return c;
  }
  MemoryOptions next_transport() { return transport_variant(transport_index_++); }
  std::vector<uint64_t> counts() const {
    const auto w = static_cast<uint64_t>(world());
    return {1, w + 1, 37, 203};
  }

 private:
  size_t chunk_index_ = 0;
  size_t transport_index_ = 0;
};

std::string world_name(const ::testing::TestParamInfo<int>& info) { return "world" + std::to_string(info.param); }
INSTANTIATE_TEST_SUITE_P(Worlds, WireDtype, ::testing::Range(2, 9), world_name);

TEST_P(WireDtype, AllreduceIsBitIdenticalAndWithinTheRoundingBound) {
  uint64_t seed = 0;
  for (const Layout& layout : spanning_layouts(world())) {
    for (DType wire : kWires) {
      for (size_t direct_max : {kAlwaysDirect, kAlwaysRing}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
          for (uint64_t count : counts()) {
            Call c = call(OpType::Allreduce, count);
            c.reduction = tgpg::Reduction{op, false};
            SCOPED_TRACE(layout.name + ", " + tgpg::dtype_name(wire) + " on the wire, " + describe(c) +
                         (direct_max == kAlwaysDirect ? ", direct" : ", ring"));
            std::vector<std::vector<std::byte>> inputs;
            for (int r = 0; r < world(); ++r) inputs.push_back(floats(++seed, count));
            auto bufs = inputs;
            const auto data = pointers(bufs);
            const tgpg::HostLayout hosts(layout.hosts);
            ASSERT_NO_FATAL_FAILURE(expect_all_returned(
                run_group(calls_for(c, layout.hosts, wire), next_transport(),
                          [&](tgpg::Collective& col, int rank) { tgpg::allreduce(col, data[rank], direct_max, hosts); })));
            for (int r = 1; r < world(); ++r) ASSERT_TRUE(bufs[r] == bufs[0]) << "rank " << r << " differs from rank 0";
            // The ring and two-level schedules round the result once more, at its
            // owner, before it goes to every rank; the direct one reduces rounded inputs.
            const bool ring = direct_max == kAlwaysRing && count >= static_cast<uint64_t>(world());
            const int roundings = ring ? world() : 1;
            size_t off_float32 = 0;
            for (size_t i = 0; i < count; ++i) {
              double exact = op == ReduceOp::Sum ? 0.0 : -std::numeric_limits<double>::infinity();
              double magnitude = 0.0;
              float float32_sum = 0.0f;
              for (const auto& in : inputs) {
                exact = op == ReduceOp::Sum ? exact + get(in, i) : std::max(exact, double{get(in, i)});
                magnitude += std::fabs(get(in, i));
                float32_sum += get(in, i);
              }
              const float got = get(bufs[0], i);
              const double bound = op == ReduceOp::Sum ? error_bound(magnitude, roundings, world(), wire)
                                                       : unit_roundoff(wire) * std::fabs(exact);
              ASSERT_LE(std::fabs(got - exact), bound) << "element " << i << ": got " << got << ", exact " << exact;
              if (ring) {
                ASSERT_TRUE(representable(got, wire)) << "element " << i << " = " << got;
              }
              off_float32 += op == ReduceOp::Sum && got != float32_sum;
            }
            // Else the test would pass without anything narrowed.
            if (op == ReduceOp::Sum && count >= 37) {
              EXPECT_GT(off_float32, 0u);
            }
          }
        }
      }
    }
  }
}

TEST_P(WireDtype, BroadcastGivesEveryRankTheRootsRoundedValues) {
  uint64_t seed = 100;
  for (const Layout& layout : spanning_layouts(world())) {
    for (DType wire : kWires) {
      for (size_t direct_max : {kAlwaysDirect, kAlwaysRing}) {
        for (int root = 0; root < world(); ++root) {
          Call c = call(OpType::Broadcast, 203);
          c.root = static_cast<uint32_t>(root);
          SCOPED_TRACE(layout.name + ", " + tgpg::dtype_name(wire) + ", " + describe(c));
          std::vector<std::vector<std::byte>> bufs;
          for (int r = 0; r < world(); ++r) bufs.push_back(floats(++seed, c.count));
          const auto expected = rounded(bufs[root], wire);
          const auto data = pointers(bufs);
          ASSERT_NO_FATAL_FAILURE(expect_all_returned(
              run_group(calls_for(c, layout.hosts, wire), next_transport(),
                        [&](tgpg::Collective& col, int rank) { tgpg::broadcast(col, data[rank], direct_max); })));
          for (int r = 0; r < world(); ++r) ASSERT_TRUE(bufs[r] == expected) << "rank " << r;
        }
      }
    }
  }
}

TEST_P(WireDtype, AllgatherGivesEveryRankTheRoundedBlocks) {
  uint64_t seed = 200;
  for (const Layout& layout : spanning_layouts(world())) {
    for (DType wire : kWires) {
      for (uint64_t count : counts()) {
        Call c = call(OpType::Allgather, count);
        SCOPED_TRACE(layout.name + ", " + tgpg::dtype_name(wire) + ", " + describe(c));
        const size_t block = 4 * count;
        std::vector<std::byte> expected;
        std::vector<std::vector<std::byte>> outs;
        for (int r = 0; r < world(); ++r) {
          const auto in = floats(++seed, count);
          const auto in_rounded = rounded(in, wire);
          expected.insert(expected.end(), in_rounded.begin(), in_rounded.end());
          outs.push_back(floats(++seed, count * world()));  // junk around this rank's block
          std::copy(in.begin(), in.end(), outs.back().begin() + r * block);
        }
        const auto data = pointers(outs);
        ASSERT_NO_FATAL_FAILURE(expect_all_returned(run_group(
            calls_for(c, layout.hosts, wire), next_transport(),
            [&](tgpg::Collective& col, int rank) { tgpg::allgather(col, data[rank]); })));
        for (int r = 0; r < world(); ++r) ASSERT_TRUE(outs[r] == expected) << "rank " << r;
      }
    }
  }
}

TEST_P(WireDtype, ReduceScatterIsWithinTheRoundingBound) {
  uint64_t seed = 300;
  for (const Layout& layout : spanning_layouts(world())) {
    for (DType wire : kWires) {
      for (uint64_t count : counts()) {
        Call c = call(OpType::ReduceScatter, count);
        c.reduction = tgpg::Reduction{ReduceOp::Sum, false};
        SCOPED_TRACE(layout.name + ", " + tgpg::dtype_name(wire) + ", " + describe(c));
        std::vector<std::vector<std::byte>> inputs;
        for (int r = 0; r < world(); ++r) inputs.push_back(floats(++seed, count * world()));
        auto bufs = inputs;
        const auto data = pointers(bufs);
        ASSERT_NO_FATAL_FAILURE(expect_all_returned(run_group(
            calls_for(c, layout.hosts, wire), next_transport(),
            [&](tgpg::Collective& col, int rank) { tgpg::reduce_scatter(col, data[rank]); })));
        for (int r = 0; r < world(); ++r) {
          for (size_t j = 0; j < count; ++j) {
            const size_t i = r * count + j;
            double exact = 0.0, magnitude = 0.0;
            for (const auto& in : inputs) {
              exact += get(in, i);
              magnitude += std::fabs(get(in, i));
            }
            // A partial sum is rounded on each link that narrows, at most world - 1 of them.
            ASSERT_LE(std::fabs(get(bufs[r], i) - exact), error_bound(magnitude, world() - 1, world(), wire))
                << "rank " << r << ", element " << j;
          }
        }
      }
    }
  }
}

// The same inputs through the same schedules with and without a wire dtype
// must give the same bits where nothing narrows.
std::vector<std::vector<std::byte>> allreduce_on(int world, const std::vector<std::string>& hosts, DType wire,
                                                 DType dtype, size_t direct_max, uint64_t count) {
  Call c;
  c.op = OpType::Allreduce;
  c.dtype = dtype;
  c.count = count;
  c.chunk_bytes = 64;
  c.reduction = tgpg::Reduction{ReduceOp::Sum, false};
  std::vector<std::vector<std::byte>> bufs;
  for (int r = 0; r < world; ++r) bufs.push_back(make_input(dtype, ReduceOp::Sum, 7 + r, count));
  const auto data = pointers(bufs);
  const tgpg::HostLayout layout(hosts);
  const GroupResult result = run_group(calls_for(c, hosts, wire), {}, [&](tgpg::Collective& col, int rank) {
    tgpg::allreduce(col, data[rank], direct_max, layout);
  });
  for (int r = 0; r < world; ++r) EXPECT_FALSE(result.errors[r]) << error_message(result.errors[r]);
  return bufs;
}

TEST_P(WireDtype, OneHostAndOtherDtypesAreUnchanged) {
  const std::vector<std::string> one_host(static_cast<size_t>(world()), "h");
  for (size_t direct_max : {kAlwaysDirect, kAlwaysRing}) {
    for (DType wire : kWires) {
      EXPECT_TRUE(allreduce_on(world(), one_host, wire, DType::Float32, direct_max, 203) ==
                  allreduce_on(world(), one_host, DType::Float32, DType::Float32, direct_max, 203))
          << "one host, " << tgpg::dtype_name(wire);
      for (const Layout& layout : spanning_layouts(world())) {
        for (DType dtype : {DType::Float64, DType::BFloat16, DType::Int32}) {
          EXPECT_TRUE(allreduce_on(world(), layout.hosts, wire, dtype, direct_max, 203) ==
                      allreduce_on(world(), layout.hosts, DType::Float32, dtype, direct_max, 203))
              << layout.name << ", " << tgpg::dtype_name(dtype);
        }
      }
    }
  }
}

// A peer that sends float32 where half-width values were expected (or the
// reverse) fails the receiver with the sizes, before its payload is read.
TEST(WireDtypeMismatch, AReceiverRefusesAChunkOfTheWrongWidth) {
  Call c;
  c.op = OpType::Allreduce;
  c.count = 64;
  c.chunk_bytes = 64;
  c.reduction = tgpg::Reduction{ReduceOp::Sum, false};
  c.timeout = std::chrono::milliseconds(250);
  std::vector<Call> calls = calls_for(c, {"a", "b"}, DType::BFloat16);
  calls[1].remote.clear();  // rank 1 sends float32
  std::vector<std::vector<std::byte>> bufs{floats(1, 64), floats(2, 64)};
  const auto data = pointers(bufs);
  const GroupResult result =
      run_group(calls, {}, [&](tgpg::Collective& col, int rank) { tgpg::allreduce(col, data[rank], kAlwaysRing); });
  ASSERT_TRUE(result.errors[0]);
  const std::string message = error_message(result.errors[0]);
  // chunk_bytes 64: 16 elements a frame, 64 bytes as float32, 32 as bfloat16.
  for (const char* part : {"bfloat16 between hosts) on rank 0: rank 1 sent 64 bytes at element ",
                           "where 32 bytes at element ", "(16 elements as bfloat16)"}) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(WireDtypeSetup, RefusesADtypeFloat32CannotTravelAs) {
  tgpg_test::MemoryNetwork network(2);
  Call c;
  c.count = 4;
  c.wire = DType::Int8;
  c.remote = {false, true};
  EXPECT_THROW(make_collective(network.messenger(0), 0, 2, c), tgpg::CollectiveError);
}

// The kernels against a scalar reference written here, over lengths that
// leave every remainder after the eight-wide vector loop, and values that
// test rounding: ties, NaN, infinities, float16 overflow and subnormals.
float reference_round(float v, DType wire) {
  if (wire == DType::Float16) return static_cast<float>(static_cast<_Float16>(v));
  if (std::isnan(v)) return v;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

std::vector<float> awkward_values(size_t count) {
  std::vector<float> special = {0.0f, -0.0f, 1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                                1.0f + std::ldexp(1.0f, -11), 65504.0f, 65520.0f, 1e6f, -1e-7f, 3e-8f,
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> any(-1000.0f, 1000.0f);
  std::vector<float> out;
  for (size_t i = 0; i < count; ++i) out.push_back(i < special.size() ? special[i] : any(rng));
  return out;
}

bool same_bits_or_both_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

TEST(WireKernels, MatchAScalarReference) {
  for (DType wire : kWires) {
    for (size_t count : {1, 7, 8, 9, 15, 16, 17, 40, 1001}) {
      SCOPED_TRACE(std::string(tgpg::dtype_name(wire)) + ", " + std::to_string(count) + " elements");
      const std::vector<float> values = awkward_values(count);
      // Narrowing, then widening, is rounding through the wire dtype.
      std::vector<std::byte> narrow(2 * count + 1);  // + 1: an odd address, as network buffers have
      tgpg::narrow_to_wire(narrow.data() + 1, reinterpret_cast<const std::byte*>(values.data()), count, wire);
      std::vector<float> widened(count);
      tgpg::widen_from_wire(reinterpret_cast<std::byte*>(widened.data()), narrow.data() + 1, count, wire);
      std::vector<float> in_place = values;
      tgpg::round_through_wire(reinterpret_cast<std::byte*>(in_place.data()), count, wire);
      std::vector<float> summed(count, 0.25f);
      tgpg::reduce_from_wire(reinterpret_cast<std::byte*>(summed.data()), narrow.data() + 1, count, wire,
                             ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        const float expected = reference_round(values[i], wire);
        ASSERT_TRUE(same_bits_or_both_nan(widened[i], expected)) << i << ": " << values[i] << " -> " << widened[i];
        ASSERT_TRUE(same_bits_or_both_nan(in_place[i], expected)) << i;
        ASSERT_TRUE(same_bits_or_both_nan(summed[i], 0.25f + expected)) << i;
      }
    }
  }
}

}  // namespace
}  // namespace tgpg_test
