#include "algorithms/collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/collective_error.h"
#include "algorithms/element_runs.h"
#include "algorithms/reduce_kernels.h"

namespace tgpg {
namespace {

struct Range {
  uint64_t begin;
  uint64_t end;
};

// The ring splits the buffer into `world` segments whose sizes differ by at most one.
Range segment(const Collective& c, uint64_t total, int index) {
  const auto w = static_cast<uint64_t>(c.world());
  const auto i = static_cast<uint64_t>(index);
  return {total * i / w, total * (i + 1) / w};
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
  for_each_element_run(frame.payload, c.element_bytes(),
                       [&](size_t first, const std::byte* src, size_t n) {
                         reduce_into(dst + first * c.element_bytes(), src, n, c.dtype(), c.reduce_op());
                       });
}

void copy_frame_into(const Collective& c, std::byte* buf, uint64_t offset, const ReceivedFrame& frame) {
  frame.copy_payload_to(buf + offset * c.element_bytes());
}

// memcpy with a null pointer is undefined even for zero bytes, and torch gives
// zero-element tensors a null data pointer.
void copy_bytes(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

int ring_index(int value, int world) { return ((value % world) + world) % world; }

// Every rank sends its whole buffer to every peer and reduces the world's
// buffers in rank order, so all ranks compute bit-identical results.
void direct_allreduce(Collective& c, std::byte* buf) {
  const uint64_t n = c.count();
  const size_t bytes = n * c.element_bytes();
  const Range all{0, n};
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

// Reduce-scatter around the ring over `world` segments of `total` elements.
// At step s this rank passes on segment (rank - shift - s) and reduces the one
// after it, so that it ends up holding the reduced segment (rank + 1 - shift).
// Each received chunk is reduced and passed on at once; with `send_final` the
// finished segment is passed on too, which is the first step of an allgather.
void ring_reduce_scatter(Collective& c, std::byte* buf, uint64_t total, int shift,
                         bool send_final) {
  const int r = c.rank();
  const int w = c.world();
  for_each_chunk(c, segment(c, total, ring_index(r - shift, w)),
                 [&](uint64_t off, uint64_t len) { c.send(c.next(), buf, off, len); });
  for (int step = 0; step < w - 1; ++step) {
    const bool forward = send_final || step < w - 2;
    for_each_chunk(c, segment(c, total, ring_index(r - shift - step - 1, w)), [&](uint64_t off, uint64_t len) {
      ReceivedFrame frame = c.recv(c.prev(), off, len);
      reduce_frame_into(c, buf, off, frame);
      if (forward) c.send(c.next(), buf, off, len);
    });
  }
}

void ring_allreduce(Collective& c, std::byte* buf) {
  const int r = c.rank();
  const int w = c.world();
  const uint64_t n = c.count();
  ring_reduce_scatter(c, buf, n, /*shift=*/0, /*send_final=*/true);
  for (int step = 0; step < w - 1; ++step) {
    const bool forward = step < w - 2;
    for_each_chunk(c, segment(c, n, ring_index(r - step, w)), [&](uint64_t off, uint64_t len) {
      ReceivedFrame frame = c.recv(c.prev(), off, len);
      copy_frame_into(c, buf, off, frame);
      if (forward) c.send(c.next(), buf, off, len);
    });
  }
}

}  // namespace

void allreduce(Collective& c, std::byte* buf, size_t direct_max_bytes) {
  if (c.world() == 1) return;
  if (c.count() * c.element_bytes() <= direct_max_bytes || c.count() < static_cast<uint64_t>(c.world())) {
    c.use_schedule(Collective::Schedule::Direct);
    direct_allreduce(c, buf);
  } else {
    ring_allreduce(c, buf);
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
  ring_reduce_scatter(c, buf, c.count() * static_cast<uint64_t>(c.world()), /*shift=*/1,
                      /*send_final=*/false);
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
