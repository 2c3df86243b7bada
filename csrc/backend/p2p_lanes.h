#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/op_queue.h"

namespace tgpg {

// The queues that run a group's point-to-point ops: one per peer and
// direction, and one for receives from any source. Each runs its ops in issue
// order on a thread of its own, started at first use, so that a receive that
// waits for one peer never holds up a send, another peer's receive, or the
// group's collectives (which have their own queue).
//
// A send lane's sequence numbers count the messages to its peer, which is
// what the receiver checks them against. Receives count per source here
// instead, under that source's lock, because a receive from any source takes
// its message from whichever peer has one.
class P2PLanes {
 public:
  explicit P2PLanes(int world);
  ~P2PLanes();
  P2PLanes(const P2PLanes&) = delete;
  P2PLanes& operator=(const P2PLanes&) = delete;

  OpQueue& send_lane(int dst);
  OpQueue& recv_lane(int src);
  OpQueue& any_source_lane();

  // Held while a message from `src` is taken, so that two receives never
  // interleave the frames of one message.
  std::mutex& source_lock(int src) { return *source_locks_.at(src); }
  // The number of the next message from `src`; call with source_lock(src) held.
  uint64_t next_message_from(int src) { return ++received_.at(src); }

  // As OpQueue: stops every lane, present and future; returns the queued
  // jobs' cancellations. `*running` tells whether any lane runs a job now.
  OpQueue::Cancelled close(const std::string& reason, bool* running = nullptr);
  // Waits, up to `limit` in all, for running jobs to leave their run part.
  void wait_run_over(std::chrono::milliseconds limit);
  // Ends every lane's thread (OpQueue::finish_worker).
  void finish_workers(std::chrono::milliseconds grace);

 private:
  OpQueue& lane(std::unique_ptr<OpQueue>& slot);  // mutex_ held
  std::vector<OpQueue*> lanes();

  std::mutex mutex_;
  std::vector<std::unique_ptr<OpQueue>> send_;
  std::vector<std::unique_ptr<OpQueue>> recv_;
  std::unique_ptr<OpQueue> any_source_;
  bool closed_ = false;
  std::string reason_;
  std::vector<std::unique_ptr<std::mutex>> source_locks_;
  std::vector<uint64_t> received_;
};

}  // namespace tgpg
