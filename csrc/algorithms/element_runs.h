#pragma once

#include <cstddef>
#include <cstring>
#include <vector>

#include "algorithms/frame.h"

namespace tgpg {

// Calls fn(first_element, bytes, n) over runs of whole elements held in
// `views`. Network buffers split wherever they like, even inside an element;
// such an element is put together in a small buffer and passed as a run of one.
template <typename Fn>
void for_each_element_run(const std::vector<ByteView>& views, size_t element_bytes, Fn&& fn) {
  alignas(16) std::byte carry[16];
  size_t carried = 0;
  size_t element = 0;
  for (const ByteView& view : views) {
    const std::byte* p = view.data;
    size_t left = view.size;
    if (carried > 0) {
      const size_t take = std::min(element_bytes - carried, left);
      std::memcpy(carry + carried, p, take);
      carried += take;
      p += take;
      left -= take;
      if (carried < element_bytes) continue;
      fn(element, static_cast<const std::byte*>(carry), size_t{1});
      ++element;
      carried = 0;
    }
    const size_t whole = left / element_bytes;
    if (whole > 0) {
      fn(element, p, whole);
      element += whole;
      p += whole * element_bytes;
      left -= whole * element_bytes;
    }
    if (left > 0) {
      std::memcpy(carry, p, left);
      carried = left;
    }
  }
}

}  // namespace tgpg
