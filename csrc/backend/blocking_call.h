#pragma once

#include <type_traits>
#include <utility>

namespace tgpg {

// Whether torch's caller waits for the op as soon as it returns: async_op=False
// in Python, which torch passes down as the options' `asyncOp` since 2.8.
// Before 2.8 the options have no such field, and every call counts as async
// (it is queued, as it always was).
template <typename Options, typename = void>
struct HasAsyncOp : std::false_type {};
template <typename Options>
struct HasAsyncOp<Options, std::void_t<decltype(std::declval<const Options&>().asyncOp)>> : std::true_type {};

template <typename Options>
bool waited_at_once(const Options& opts) {
  if constexpr (HasAsyncOp<Options>::value) {
    return !opts.asyncOp;
  } else {
    (void)opts;
    return false;
  }
}

}  // namespace tgpg
