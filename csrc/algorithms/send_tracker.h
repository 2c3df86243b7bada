#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tgpg {

// Counts, per peer, payloads handed to the transport without a copy and not
// yet released by it. A collective may only complete, and its caller reuse the
// tensor, once every payload is released. `keepalive` owns the memory being
// sent, so that even a collective that fails early can never let the
// transport read freed memory.
class SendTracker {
 public:
  explicit SendTracker(std::shared_ptr<void> keepalive) : keepalive_(std::move(keepalive)) {}

  // Keeps `memory` alive as long as the tracker: a payload the collective made
  // for one send (a chunk narrowed to the wire dtype), which the transport may
  // read until it releases it, even after the collective has failed.
  void hold(std::shared_ptr<const void> memory);

  // A payload for `dst` handed to the transport, and given back by it.
  void acquire(int dst);
  void release(int dst);

  // Ends every wait, present and future, at once. For a transport that has
  // failed: what it still holds will never reach a peer, and may stay held
  // until its connections are torn down (gRPC keeps a dead socket's unsent
  // bytes until then). The memory stays alive through `keepalive` until the
  // last release, so an op that returns early leaves nothing dangling.
  void abandon(const std::string& reason);

  struct Outcome {
    bool released = false;
    std::string abandoned;     // why the transport gave up; empty unless it did
    std::vector<int> holding;  // peers whose payloads were still held when the wait ended
  };
  Outcome wait_released(std::chrono::steady_clock::time_point deadline);

 private:
  std::shared_ptr<void> keepalive_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<const void>> held_;
  std::condition_variable changed_;
  size_t outstanding_ = 0;
  std::vector<size_t> outstanding_by_peer_;  // indexed by rank, grown on demand
  std::string abandoned_;
};

}  // namespace tgpg
