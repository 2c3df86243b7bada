#include "algorithms/collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

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

template <typename Fn>
void for_each_chunk(const Collective& c, Range range, Fn&& fn) {
  for (uint64_t begin = range.begin; begin < range.end; begin += c.chunk_elements()) {
    fn(begin, std::min<uint64_t>(c.chunk_elements(), range.end - begin));
  }
}

void reduce_frame_into(const Collective& c, std::byte* buf, uint64_t offset,
                       const ReceivedFrame& frame, ReduceOp op) {
  std::byte* dst = buf + offset * c.element_bytes();
  for_each_element_run(frame.payload, c.element_bytes(),
                       [&](size_t first, const std::byte* src, size_t n) {
                         reduce_into(dst + first * c.element_bytes(), src, n, c.dtype(), op);
                       });
}

void copy_frame_into(const Collective& c, std::byte* buf, uint64_t offset, const ReceivedFrame& frame) {
  frame.copy_payload_to(buf + offset * c.element_bytes());
}

int ring_index(int value, int world) { return ((value % world) + world) % world; }

// Every rank sends its whole buffer to every peer and reduces the world's
// buffers in rank order, so all ranks compute bit-identical results.
void direct_allreduce(Collective& c, std::byte* buf, ReduceOp op) {
  const uint64_t n = c.count();
  const size_t bytes = n * c.element_bytes();
  for (int peer = 0; peer < c.world(); ++peer) {
    if (peer != c.rank()) c.send(peer, buf, 0, n);
  }
  std::vector<std::byte> result(bytes);
  for (int src = 0; src < c.world(); ++src) {
    if (src == c.rank()) {
      if (src == 0) std::memcpy(result.data(), buf, bytes);
      else reduce_into(result.data(), buf, n, c.dtype(), op);
      continue;
    }
    ReceivedFrame frame = c.recv(src, 0, n);
    if (src == 0) copy_frame_into(c, result.data(), 0, frame);
    else reduce_frame_into(c, result.data(), 0, frame, op);
  }
  // `buf` is still being read by the transport until our sends are released.
  c.wait_sends_released();
  std::memcpy(buf, result.data(), bytes);
}

void ring_allreduce(Collective& c, std::byte* buf, ReduceOp op) {
  const int r = c.rank();
  const int w = c.world();
  const uint64_t n = c.count();
  for_each_chunk(c, segment(c, n, r), [&](uint64_t off, uint64_t len) { c.send(c.next(), buf, off, len); });
  // Reduce-scatter: each received chunk is reduced and passed on at once. After
  // the last step this rank holds the final value of segment r + 1, and passing
  // it on is the first step of the allgather.
  for (int step = 0; step < w - 1; ++step) {
    for_each_chunk(c, segment(c, n, ring_index(r - step - 1, w)), [&](uint64_t off, uint64_t len) {
      ReceivedFrame frame = c.recv(c.prev(), off, len);
      reduce_frame_into(c, buf, off, frame, op);
      c.send(c.next(), buf, off, len);
    });
  }
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

void allreduce(Collective& c, std::byte* buf, ReduceOp op, size_t direct_max_bytes) {
  if (c.world() == 1) return;
  if (c.count() * c.element_bytes() <= direct_max_bytes || c.count() < static_cast<uint64_t>(c.world())) {
    direct_allreduce(c, buf, op);
  } else {
    ring_allreduce(c, buf, op);
  }
}

void broadcast(Collective& c, std::byte* buf, size_t direct_max_bytes) {
  const int w = c.world();
  if (w == 1) return;
  const int root = static_cast<int>(c.root());
  const Range all{0, c.count()};
  if (c.count() * c.element_bytes() <= direct_max_bytes) {
    if (c.rank() == root) {
      for (int peer = 0; peer < w; ++peer) {
        if (peer != root) c.send(peer, buf, 0, c.count());
      }
    } else {
      copy_frame_into(c, buf, 0, c.recv(root, 0, c.count()));
    }
    return;
  }
  const int position = ring_index(c.rank() - root, w);
  const bool forward = position < w - 1;
  for_each_chunk(c, all, [&](uint64_t off, uint64_t len) {
    if (position != 0) copy_frame_into(c, buf, off, c.recv(c.prev(), off, len));
    if (forward) c.send(c.next(), buf, off, len);
  });
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

void barrier(Collective& c) {
  const int w = c.world();
  for (int distance = 1, round = 0; distance < w; distance *= 2, ++round) {
    // The round travels in the offset field so that rounds cannot be confused.
    c.send(ring_index(c.rank() + distance, w), nullptr, static_cast<uint64_t>(round), 0);
    c.recv(ring_index(c.rank() - distance, w), static_cast<uint64_t>(round), 0);
  }
}

}  // namespace tgpg
