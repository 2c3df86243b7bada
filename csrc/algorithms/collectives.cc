#include "algorithms/collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/copy_kernels.h"
#include "algorithms/element_runs.h"
#include "algorithms/reduce_kernels.h"
#include "algorithms/wire_kernels.h"

namespace tgpg {
namespace {

struct Range {
  uint64_t begin;
  uint64_t end;
};

// A ring splits its range into one segment per member, whose sizes differ by at most one.
Range segment(Range range, int parts, int index) {
  const uint64_t total = range.end - range.begin;
  const auto p = static_cast<uint64_t>(parts);
  const auto i = static_cast<uint64_t>(index);
  return {range.begin + total * i / p, range.begin + total * (i + 1) / p};
}

// The ranks a ring schedule runs over, in ring order, and this rank's place
// among them: the whole group, the ranks of one host, or one rank per host.
struct Ring {
  std::vector<int> members;
  int position;

  int size() const { return static_cast<int>(members.size()); }
  int next() const { return members[static_cast<size_t>((position + 1) % size())]; }
  int prev() const { return members[static_cast<size_t>((position + size() - 1) % size())]; }
};

Ring whole_group(const Collective& c) {
  Ring ring{std::vector<int>(static_cast<size_t>(c.world())), c.rank()};
  for (int r = 0; r < c.world(); ++r) ring.members[static_cast<size_t>(r)] = r;
  return ring;
}

// Every frame carries at most one chunk, which is what lets a receiver bound
// what it buffers per frame. An empty range still gets one empty frame, so that
// the receiver checks its peer's header even when there is nothing to move.
template <typename Fn>
void for_each_chunk(const Collective& c, Range range, Fn&& fn) {
  if (range.begin == range.end) {
    fn(range.begin, uint64_t{0});
    return;
  }
  for (uint64_t begin = range.begin; begin < range.end; begin += c.chunk_elements()) {
    fn(begin, std::min<uint64_t>(c.chunk_elements(), range.end - begin));
  }
}

void reduce_frame_into(const Collective& c, std::byte* buf, uint64_t offset, const ReceivedFrame& frame) {
  std::byte* dst = buf + offset * c.element_bytes();
  if (frame.narrowed) {
    // Widened and reduced in float32; the value is rounded again only where it is sent on.
    const size_t wire_bytes = element_size(c.wire_dtype());
    for_each_element_run(frame.payload, wire_bytes, [&](size_t first, const std::byte* src, size_t n) {
      reduce_from_wire(dst + first * c.element_bytes(), src, n, c.wire_dtype(), c.reduce_op());
    });
    return;
  }
  for_each_element_run(frame.payload, c.element_bytes(),
                       [&](size_t first, const std::byte* src, size_t n) {
                         reduce_into(dst + first * c.element_bytes(), src, n, c.dtype(), c.reduce_op());
                       });
}

// Received chunks of a collective that moves this much per rank go to memory
// past the caches. A smaller buffer may stay cached for whoever reads it next:
// at 1 MiB streaming measured no faster (world 2, AMD EPYC with 1 MiB of L2
// per core), at 4 MiB and up broadcast and allgather ran 15-25% faster with it.
constexpr uint64_t kCopyPastCacheMinBytes = uint64_t{4} << 20;

void copy_frame_into(const Collective& c, std::byte* buf, uint64_t offset, const ReceivedFrame& frame) {
  std::byte* out = buf + offset * c.element_bytes();
  if (frame.narrowed) {
    const size_t wire_bytes = element_size(c.wire_dtype());
    for_each_element_run(frame.payload, wire_bytes, [&](size_t first, const std::byte* src, size_t n) {
      widen_from_wire(out + first * c.element_bytes(), src, n, c.wire_dtype());
    });
    return;
  }
  if (c.count() * c.element_bytes() >= kCopyPastCacheMinBytes) {
    frame.copy_payload_to(out, copy_past_cache);
  } else {
    frame.copy_payload_to(out);
  }
}

// memcpy with a null pointer is undefined even for zero bytes, and torch gives
// zero-element tensors a null data pointer.
void copy_bytes(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

int ring_index(int value, int world) { return ((value % world) + world) % world; }

// Every rank sends its whole buffer to every peer and reduces the world's
// buffers in rank order, so all ranks compute bit-identical results. When
// links between hosts narrow, each rank first rounds its own buffer through
// the wire dtype: every rank then reduces the same values, whichever link
// each came over.
void direct_allreduce(Collective& c, std::byte* buf) {
  const uint64_t n = c.count();
  const size_t bytes = n * c.element_bytes();
  const Range all{0, n};
  c.round_to_wire(buf, 0, n);
  for (int peer = 0; peer < c.world(); ++peer) {
    if (peer != c.rank()) for_each_chunk(c, all, [&](uint64_t off, uint64_t len) { c.send(peer, buf, off, len); });
  }
  std::vector<std::byte> result(bytes);
  for (int src = 0; src < c.world(); ++src) {
    if (src == c.rank()) {
      if (src == 0) copy_bytes(result.data(), buf, bytes);
      else reduce_into(result.data(), buf, n, c.dtype(), c.reduce_op());
      continue;
    }
    for_each_chunk(c, all, [&](uint64_t off, uint64_t len) {
      ReceivedFrame frame = c.recv(src, off, len);
      if (src == 0) copy_frame_into(c, result.data(), off, frame);
      else reduce_frame_into(c, result.data(), off, frame);
    });
  }
  // `buf` is still being read by the transport until our sends are released.
  c.wait_sends_released();
  copy_bytes(buf, result.data(), bytes);
}

// Reduce-scatter around `ring` over its segments of `range`. At step s this
// rank passes on segment (position - shift - s) and reduces the one after it,
// so that it ends up holding the reduced segment (position + 1 - shift). Each
// received chunk is reduced and passed on at once; with `send_final` the
// finished segment is passed on too, which is the first step of an allgather.
// Partial sums are rounded to the wire dtype only on the links that narrow;
// the finished segment, which every rank will hold, is rounded by its owner
// before it goes anywhere, so that no link changes it afterwards. Its first
// send and each step are functions of their own, which the two-level allreduce
// interleaves over pieces of its buffer.
void ring_reduce_scatter_first_send(Collective& c, const Ring& ring, std::byte* buf, Range range, int shift) {
  for_each_chunk(c, segment(range, ring.size(), ring_index(ring.position - shift, ring.size())),
                 [&](uint64_t off, uint64_t len) { c.send(ring.next(), buf, off, len); });
}

void ring_reduce_scatter_step(Collective& c, const Ring& ring, std::byte* buf, Range range, int shift,
                              bool send_final, int step) {
  const int w = ring.size();
  const bool forward = send_final || step < w - 2;
  const Range reduced = segment(range, w, ring_index(ring.position - shift - step - 1, w));
  for_each_chunk(c, reduced, [&](uint64_t off, uint64_t len) {
    ReceivedFrame frame = c.recv(ring.prev(), off, len);
    reduce_frame_into(c, buf, off, frame);
    if (send_final && step == w - 2) c.round_to_wire(buf, off, len);
    if (forward) c.send(ring.next(), buf, off, len);
  });
}

void ring_reduce_scatter(Collective& c, const Ring& ring, std::byte* buf, Range range, int shift,
                         bool send_final) {
  ring_reduce_scatter_first_send(c, ring, buf, range, shift);
  for (int step = 0; step < ring.size() - 1; ++step) {
    ring_reduce_scatter_step(c, ring, buf, range, shift, send_final, step);
  }
}

// Allgather around `ring` of its segments of `range`, this rank holding the
// finished segment `owned`; `already_sent` when a reduce-scatter with
// send_final has passed it on. Step by step as the reduce-scatter.
void ring_allgather_step(Collective& c, const Ring& ring, std::byte* buf, Range range, int owned, int step) {
  const int w = ring.size();
  const bool forward = step < w - 2;
  for_each_chunk(c, segment(range, w, ring_index(owned - step - 1, w)), [&](uint64_t off, uint64_t len) {
    ReceivedFrame frame = c.recv(ring.prev(), off, len);
    copy_frame_into(c, buf, off, frame);
    if (forward) c.send(ring.next(), buf, off, len);
  });
}

void ring_allgather(Collective& c, const Ring& ring, std::byte* buf, Range range, int owned, bool already_sent) {
  if (!already_sent) {
    for_each_chunk(c, segment(range, ring.size(), owned),
                   [&](uint64_t off, uint64_t len) { c.send(ring.next(), buf, off, len); });
  }
  for (int step = 0; step < ring.size() - 1; ++step) ring_allgather_step(c, ring, buf, range, owned, step);
}

void ring_allreduce(Collective& c, const Ring& ring, std::byte* buf, Range range) {
  ring_reduce_scatter(c, ring, buf, range, /*shift=*/0, /*send_final=*/true);
  ring_allgather(c, ring, buf, range, ring_index(ring.position + 1, ring.size()), /*already_sent=*/true);
}

// How many pieces the two-level allreduce pipelines: as many as keep every
// frame across hosts a whole chunk (each piece splits into local x across
// segments), at most kMaxTwoLevelPieces. A buffer too small for two runs in one
// piece, exactly as an unpipelined schedule would.
constexpr uint64_t kMaxTwoLevelPieces = 8;

uint64_t two_level_pieces(const Collective& c, const Ring& local, const Ring& across) {
  const uint64_t piece_min = static_cast<uint64_t>(local.size()) * static_cast<uint64_t>(across.size()) *
                             static_cast<uint64_t>(c.chunk_elements());
  return std::clamp<uint64_t>(c.count() / std::max<uint64_t>(piece_min, 1), 1, kMaxTwoLevelPieces);
}

// Reduce-scatter inside each host, so that every rank holds its host's sum of
// one segment; allreduce of that segment across hosts, with the rank at the
// same place on every other host; allgather inside each host. Each byte
// crosses between two hosts 2 (hosts - 1) / hosts times per host instead of
// 2 (world - 1) / world times per rank on the border.
//
// The buffer goes in pieces, so that the work inside a host hides behind the
// link between hosts, the slowest one: a piece's first frames across leave as
// soon as its reduce-scatter inside the host is done, while the next piece's
// runs; each piece's allgather inside the host runs while later pieces are
// still on the link. Sends return at once, so only the receives order the
// work. The steps across hosts run step by step over all pieces, in the order
// in which the peer across sent them: frames from one peer arrive in the order
// sent, and each receive checks the offset it expects.
void two_level_allreduce(Collective& c, std::byte* buf, const HostLayout& hosts) {
  const Range all{0, c.count()};
  const Ring local{hosts.local_ranks(c.rank()), hosts.position_on_host(c.rank())};
  const Ring across{hosts.counterparts(c.rank()), hosts.host_of(c.rank())};
  const uint64_t pieces = two_level_pieces(c, local, across);
  const auto piece = [&](uint64_t i) { return segment(all, static_cast<int>(pieces), static_cast<int>(i)); };
  // The segment of piece i that this rank reduces across hosts after the local reduce-scatter.
  const auto across_part = [&](uint64_t i) { return segment(piece(i), local.size(), local.position); };
  const int owned_across = ring_index(across.position + 1, across.size());
  for (uint64_t i = 0; i < pieces; ++i) {
    ring_reduce_scatter(c, local, buf, piece(i), /*shift=*/1, /*send_final=*/false);
    ring_reduce_scatter_first_send(c, across, buf, across_part(i), /*shift=*/0);
  }
  for (int step = 0; step < across.size() - 1; ++step) {
    for (uint64_t i = 0; i < pieces; ++i) {
      ring_reduce_scatter_step(c, across, buf, across_part(i), /*shift=*/0, /*send_final=*/true, step);
    }
  }
  for (int step = 0; step < across.size() - 1; ++step) {
    for (uint64_t i = 0; i < pieces; ++i) {
      ring_allgather_step(c, across, buf, across_part(i), owned_across, step);
      if (step == across.size() - 2) ring_allgather(c, local, buf, piece(i), local.position, /*already_sent=*/false);
    }
  }
}

}  // namespace

void allreduce(Collective& c, std::byte* buf, size_t direct_max_bytes, const HostLayout& hosts) {
  if (c.world() == 1) return;
  if (c.count() * c.element_bytes() <= direct_max_bytes || c.count() < static_cast<uint64_t>(c.world())) {
    c.use_schedule(Collective::Schedule::Direct);
    direct_allreduce(c, buf);
  } else if (hosts.two_level() && hosts.world() == c.world()) {
    c.use_schedule(Collective::Schedule::TwoLevel);
    two_level_allreduce(c, buf, hosts);
  } else {
    ring_allreduce(c, whole_group(c), buf, Range{0, c.count()});
  }
}

void broadcast(Collective& c, std::byte* buf, size_t direct_max_bytes) {
  const int w = c.world();
  if (w == 1) return;
  const int root = static_cast<int>(c.root());
  const bool is_root = c.rank() == root;
  // Two ranks that both believe they are the root would each send, never
  // receive, and return different data. So the root waits for an empty
  // acknowledgement (at offset `count`) from the rank after it, sent as soon as
  // that rank has checked the first frame. A rank that disagrees sends data
  // for its own root instead, which fails the header check on both sides; the
  // acknowledgement overlaps with the rest of the transfer.
  const int successor = (root + 1) % w;
  const uint64_t ack_offset = c.count();
  const Range all{0, c.count()};
  // What reaches another host is rounded; the root and the ranks on its host
  // hold the same rounded values, or they would differ from the rest.
  if (is_root) c.round_to_wire(buf, 0, c.count());
  if (c.count() * c.element_bytes() <= direct_max_bytes) {
    c.use_schedule(Collective::Schedule::Direct);
    if (is_root) {
      for (int peer = 0; peer < w; ++peer) {
        if (peer != root) for_each_chunk(c, all, [&](uint64_t off, uint64_t len) { c.send(peer, buf, off, len); });
      }
      c.recv(successor, ack_offset, 0);
    } else {
      bool acknowledged = false;
      for_each_chunk(c, all, [&](uint64_t off, uint64_t len) {
        copy_frame_into(c, buf, off, c.recv(root, off, len));
        if (c.rank() == successor && !acknowledged) {
          c.send(root, nullptr, ack_offset, 0);
          acknowledged = true;
        }
      });
    }
    return;
  }
  const int position = ring_index(c.rank() - root, w);
  const bool forward = position < w - 1;
  bool acknowledged = false;
  for_each_chunk(c, all, [&](uint64_t off, uint64_t len) {
    if (!is_root) copy_frame_into(c, buf, off, c.recv(c.prev(), off, len));
    if (forward) c.send(c.next(), buf, off, len);
    if (position == 1 && !acknowledged) {
      c.send(root, nullptr, ack_offset, 0);
      acknowledged = true;
    }
  });
  if (is_root) c.recv(successor, ack_offset, 0);
}

void allgather(Collective& c, std::byte* out) {
  const int r = c.rank();
  const int w = c.world();
  if (w == 1) return;
  const uint64_t n = c.count();
  auto block = [&](int index) {
    const auto b = static_cast<uint64_t>(index);
    return Range{b * n, (b + 1) * n};
  };
  // Every rank ends with the block as the other hosts receive it.
  c.round_to_wire(out, block(r).begin, n);
  for_each_chunk(c, block(r), [&](uint64_t off, uint64_t len) { c.send(c.next(), out, off, len); });
  for (int step = 0; step < w - 1; ++step) {
    const bool forward = step < w - 2;
    for_each_chunk(c, block(ring_index(r - step - 1, w)), [&](uint64_t off, uint64_t len) {
      copy_frame_into(c, out, off, c.recv(c.prev(), off, len));
      if (forward) c.send(c.next(), out, off, len);
    });
  }
}

void reduce_scatter(Collective& c, std::byte* buf) {
  if (c.world() == 1) return;
  ring_reduce_scatter(c, whole_group(c), buf, Range{0, c.count() * static_cast<uint64_t>(c.world())},
                      /*shift=*/1, /*send_final=*/false);
}

void gather(Collective& c, const std::byte* in, std::byte* out) {
  const int root = static_cast<int>(c.root());
  const uint64_t n = c.count();
  const Range block{0, n};
  if (c.rank() != root) {
    for_each_chunk(c, block, [&](uint64_t off, uint64_t len) { c.send(root, in, off, len); });
    return;
  }
  copy_bytes(out + static_cast<uint64_t>(root) * n * c.element_bytes(), in, n * c.element_bytes());
  for (int src = 0; src < c.world(); ++src) {
    if (src == root) continue;
    for_each_chunk(c, block, [&](uint64_t off, uint64_t len) {
      copy_frame_into(c, out, static_cast<uint64_t>(src) * n + off, c.recv(src, off, len));
    });
  }
}

void scatter(Collective& c, const std::byte* in, std::byte* out) {
  const int root = static_cast<int>(c.root());
  const uint64_t n = c.count();
  const Range block{0, n};
  if (c.rank() != root) {
    for_each_chunk(c, block, [&](uint64_t off, uint64_t len) { copy_frame_into(c, out, off, c.recv(root, off, len)); });
    return;
  }
  for (int dst = 0; dst < c.world(); ++dst) {
    if (dst == root) continue;
    const std::byte* block_in = in + static_cast<uint64_t>(dst) * n * c.element_bytes();
    for_each_chunk(c, block, [&](uint64_t off, uint64_t len) { c.send(dst, block_in, off, len); });
  }
  copy_bytes(out, in + static_cast<uint64_t>(root) * n * c.element_bytes(), n * c.element_bytes());
}

void alltoall(Collective& c, const std::byte* in, std::byte* out) {
  const uint64_t n = c.count();
  std::vector<Block> blocks(static_cast<size_t>(c.world()));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = {i * n, n};
  alltoallv(c, in, blocks, out, blocks);
}

void alltoallv(Collective& c, const std::byte* in, const std::vector<Block>& send, std::byte* out,
               const std::vector<Block>& recv) {
  const size_t esize = c.element_bytes();
  const int r = c.rank();
  if (send[r].count != recv[r].count) {
    throw CollectiveError(c.describe() + " on rank " + std::to_string(r) + ": this rank sends itself " +
                          std::to_string(send[r].count) + " elements but expects " + std::to_string(recv[r].count) +
                          "; its input split " + std::to_string(r) + " and output split " + std::to_string(r) +
                          " must be equal.");
  }
  // Everyone sends first, then receives: frames are queued, so no rank waits on another's receive.
  for (int step = 1; step < c.world(); ++step) {
    const int dst = ring_index(r + step, c.world());
    Collective pair = c.with_count(send[dst].count);
    const std::byte* block = in + send[dst].offset * esize;
    for_each_chunk(pair, Range{0, send[dst].count},
                   [&](uint64_t off, uint64_t len) { pair.send(dst, block, off, len); });
  }
  copy_bytes(out + recv[r].offset * esize, in + send[r].offset * esize, send[r].count * esize);
  for (int step = 1; step < c.world(); ++step) {
    const int src = ring_index(r - step, c.world());
    Collective pair = c.with_count(recv[src].count);
    for_each_chunk(pair, Range{0, recv[src].count}, [&](uint64_t off, uint64_t len) {
      copy_frame_into(pair, out, recv[src].offset + off, pair.recv(src, off, len));
    });
  }
}

void send_message(Collective& c, int dst, const std::byte* data) {
  for_each_chunk(c, Range{0, c.count()}, [&](uint64_t off, uint64_t len) { c.send(dst, data, off, len); });
}

void recv_message(Collective& c, int src, std::byte* data) {
  for_each_chunk(c, Range{0, c.count()},
                 [&](uint64_t off, uint64_t len) { copy_frame_into(c, data, off, c.recv(src, off, len)); });
}

void barrier(Collective& c) {
  const int w = c.world();
  for (int distance = 1, round = 0; distance < w; distance *= 2, ++round) {
    // The round travels in the offset field so that rounds cannot be confused.
    c.send(ring_index(c.rank() + distance, w), nullptr, static_cast<uint64_t>(round), 0);
    c.recv(ring_index(c.rank() - distance, w), static_cast<uint64_t>(round), 0);
  }
}

}  // namespace tgpg
