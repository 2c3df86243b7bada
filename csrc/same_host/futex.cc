#include "same_host/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace tgpg {
namespace {

// futex_waitv (Linux 5.16) as the kernel's ABI defines it, spelled out here
// rather than taken from <linux/futex.h>, so that the build needs no headers of
// 5.16 or later (manylinux_2_28, RHEL 8 and Ubuntu 20.04 ship older ones); a
// kernel that lacks the call refuses it at run time.
struct FutexWaiter {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(FutexWaiter) == 24, "struct futex_waitv is 24 bytes");
constexpr long kSysFutexWaitv = 449;     // one number on every architecture (asm-generic)
constexpr uint32_t kFutexSize32 = 0x02;  // FUTEX2_SIZE_U32

// Set once the kernel or a seccomp filter has refused futex_waitv; the process
// then sleeps on one word at a time.
std::atomic<bool> futex_waitv_refused{false};

}  // namespace

timespec to_timespec(std::chrono::milliseconds span) {
  const auto ms = span.count();
  return {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000L};
}

timespec monotonic_deadline(std::chrono::milliseconds after) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const timespec span = to_timespec(after);
  timespec deadline{now.tv_sec + span.tv_sec, now.tv_nsec + span.tv_nsec};
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  return deadline;
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::optional<std::chrono::milliseconds> at_most) {
  const std::optional<timespec> timeout = at_most ? std::optional(to_timespec(*at_most)) : std::nullopt;
  // EAGAIN (the word moved on), EINTR and ETIMEDOUT all mean: look again.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, timeout ? &*timeout : nullptr,
            nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word, bool process_private) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), process_private ? FUTEX_WAKE_PRIVATE : FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
}

bool futex_wait_either(std::atomic<uint32_t>& shared, uint32_t shared_seen, std::atomic<uint32_t>& local,
                       uint32_t local_seen, const timespec* deadline) {
  if (futex_waitv_refused.load(std::memory_order_relaxed)) return false;
  FutexWaiter waiters[2] = {};
  waiters[0].uaddr = reinterpret_cast<uintptr_t>(&shared);
  waiters[0].val = shared_seen;
  waiters[0].flags = kFutexSize32;
  waiters[1].uaddr = reinterpret_cast<uintptr_t>(&local);
  waiters[1].val = local_seen;
  waiters[1].flags = kFutexSize32 | FUTEX_PRIVATE_FLAG;
  if (::syscall(kSysFutexWaitv, waiters, 2, 0, deadline, CLOCK_MONOTONIC) >= 0) return true;
  // EAGAIN (a word moved on), EINTR and ETIMEDOUT all mean: look again. Any
  // other answer would come back at once on every call: a sleeper that kept
  // asking would spin.
  if (errno == EAGAIN || errno == EINTR || errno == ETIMEDOUT) return true;
  futex_waitv_refused.store(true, std::memory_order_relaxed);
  return false;
}

void sleep_while_unmoved(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<uint32_t>& waiting,
                         std::optional<std::chrono::milliseconds> at_most) {
  waiting.store(1, std::memory_order_seq_cst);
  if (word.load(std::memory_order_seq_cst) == seen) futex_wait(word, seen, at_most);
  waiting.store(0, std::memory_order_relaxed);
}

void wake_if_waiting(std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiting) {
  if (waiting.load(std::memory_order_seq_cst) != 0) futex_wake_all(word);
}

}  // namespace tgpg
