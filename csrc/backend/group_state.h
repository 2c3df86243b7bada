#pragma once

// =============================================================================
// The lifecycle of one process group on one rank
// =============================================================================
//
//                 every rank reported ok
//   Initializing ────────────────────────> Ready
//        │                                   │  first failure (a job's error, the
//        │ some rank reported a failure,     │  transport's, or abort())
//        │ or did not report in time         v
//        │                                Failed(reason) ──┐
//        v                                   │             │ shutdown(), abort(),
//   (the constructor throws on every         │             │ destroy_process_group(),
//    rank, naming every failed rank's        v             │ the destructor
//    reason; there is nothing to destroy) Destroyed <──────┘ (Ready goes here too)
//
// Initializing (ProcessGroupGrpc::rendezvous). Each rank joins the group's
//   instance, a fresh name that rank 0 hands out (group_instance.h), starts its
//   transport, publishes its address, connects to every peer and then writes its
//   outcome ("ok" or its reason) under the instance's store prefix, even if its own
//   transport could not start (it then publishes an empty address, so that
//   nobody waits for it). It keeps its server up until every rank has
//   reported or connect_timeout has passed since its own report, so that no
//   peer that is still connecting finds it gone. If any rank failed, every
//   rank raises DistBackendError naming every failed rank and its reason
//   ("rank 2: ... authentication failed ..."), and ranks that never reported.
//
// Ready. Calls queue jobs; each gets its sequence number under the queue's
//   lock (OpQueue::push), so sequence order is queue order is run order.
//
// Ready -> Failed(reason), on the first of:
//   - a job throws (mismatch, timeout, a peer's abort or broken link seen by a
//     wait): the transport is marked failed (every wait throws), and if the
//     failure began here, peers are sent an Abort so they stop waiting;
//   - the transport reports a failure on its own (a broken link, a bad frame,
//     a peer's Abort): noticed at the next call or job;
//   - abort(): as a local failure, then Destroyed.
//   The queue is closed: queued jobs fail with "failed earlier ... (reason)",
//   later calls fail at once with the same original reason. A failed group
//   never becomes Ready again; destroy it and create a new one.
//
// Ready or Failed -> Destroyed (shutdown(), abort(), the destructor), bounded:
//   1. the queue is closed, queued jobs fail; if a job is running, the
//      transport is marked failed so that a wait for a peer wakes at once;
//   2. the worker gets a short grace to leave that job;
//   3. the transport shuts down (every link closed in parallel, under one
//      deadline);
//   4. (destructor only) the worker thread ends: joined, or detached when the
//      last reference is dropped on the worker itself (a future callback) or
//      while a user callback still runs on it. It never touches the process
//      group object once its job has left the part that uses it.
//   Work issued afterwards fails at once, naming why the group is unusable.
//
// Futures and their callbacks are completed outside every lock of ours and
// outside the failure path (OpQueue runs them after a job's group-facing part);
// a callback that throws is contained (GrpcWork).

#include <mutex>
#include <string>

namespace tgpg {

class GroupState {
 public:
  enum class Phase { Initializing, Ready, Failed, Destroyed };

  // Initializing -> Ready.
  void ready() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ == Phase::Initializing) phase_ = Phase::Ready;
  }

  // Ready (or Initializing) -> Failed. True only for the call that made the
  // transition: that caller reports the failure. The first reason is kept.
  bool fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ == Phase::Failed || phase_ == Phase::Destroyed) return false;
    phase_ = Phase::Failed;
    reason_ = reason;
    return true;
  }

  // Any phase -> Destroyed; returns the phase it left. A failure reason stays.
  Phase destroy() {
    std::lock_guard<std::mutex> lock(mutex_);
    const Phase before = phase_;
    phase_ = Phase::Destroyed;
    return before;
  }

  Phase phase() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return phase_;
  }
  // Why the group failed; empty unless it failed before being destroyed.
  std::string failure() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reason_;
  }

 private:
  mutable std::mutex mutex_;
  Phase phase_ = Phase::Initializing;
  std::string reason_;  // set only by fail(), so only for a group that failed
};

}  // namespace tgpg
