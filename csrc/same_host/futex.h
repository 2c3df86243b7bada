#pragma once

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace tgpg {

// Sleeping on a word of shared memory until another process moves it: the
// waits of the same-host transport (rings and segments). Words in a file that
// two processes map are shared futexes (the kernel matches waiter and waker by
// the file's page); a word only this process sees is a private one.
// std::atomic<uint32_t> is a plain 32-bit word, which is what a futex is.
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "processes share these atomics, which only lock-free atomics allow");

timespec to_timespec(std::chrono::milliseconds span);
// CLOCK_MONOTONIC now plus `after`, as futex_waitv's deadline.
timespec monotonic_deadline(std::chrono::milliseconds after);

// Sleeps while `word` holds `expected`, up to `at_most` (none: no bound). It
// may return early (a wake, a signal): callers look again.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::optional<std::chrono::milliseconds> at_most);

// Wakes every sleeper on `word`: shared (a word in a mapped file) unless
// `process_private`.
void futex_wake_all(std::atomic<uint32_t>& word, bool process_private = false);

// Sleeps until `shared` (a word in a mapped file) leaves `shared_seen` or
// `local` (a word of this process) leaves `local_seen`, or `deadline` on
// CLOCK_MONOTONIC passes (null: none). False where the kernel refuses
// futex_waitv (before Linux 5.16, or a seccomp filter); the caller then sleeps
// some other way. The call is chosen at run time, so the build needs no
// headers of Linux 5.16 or later.
bool futex_wait_either(std::atomic<uint32_t>& shared, uint32_t shared_seen, std::atomic<uint32_t>& local,
                       uint32_t local_seen, const timespec* deadline);

// One protocol for a sleeper and a mover of one shared word: the sleeper
// raises its `waiting` flag, looks at the word once more, and sleeps only if
// it still holds `seen`; the mover moves the word on, then wakes only if the
// flag is up. seq_cst on both sides: either the sleeper sees the word move
// before it sleeps, or the mover sees the flag and wakes it. A move between
// the look and the sleep makes the futex return at once. A word that keeps up
// costs the mover no system call.
void sleep_while_unmoved(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<uint32_t>& waiting,
                         std::optional<std::chrono::milliseconds> at_most);
void wake_if_waiting(std::atomic<uint32_t>& word, std::atomic<uint32_t>& waiting);

}  // namespace tgpg
