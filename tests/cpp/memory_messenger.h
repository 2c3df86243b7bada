#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/messenger.h"

namespace tgpg_test {

struct MemoryOptions {
  // The receiver reads the sender's own memory, and the payload is released
  // only when the receiver drops the frame. This is the latest a real transport
  // may release (flow control can hold a payload until the peer reads), so an
  // algorithm that touches a buffer while it is still being sent computes
  // wrong results here, and the thread sanitizer sees the race.
  bool zero_copy = false;
  // Hands each payload over as several views cut at odd byte offsets, even
  // inside elements, as gRPC's receive buffers do.
  bool split_payloads = false;
};

// All ranks of one group inside one process: a FIFO queue of frames per
// (source, destination) pair, so that frames between two ranks stay in order.
class MemoryNetwork {
 public:
  explicit MemoryNetwork(int world, MemoryOptions options = {});
  ~MemoryNetwork();
  MemoryNetwork(const MemoryNetwork&) = delete;
  MemoryNetwork& operator=(const MemoryNetwork&) = delete;

  int world() const { return world_; }
  // The Messenger that rank `rank` uses; it lives as long as the network.
  tgpg::Messenger& messenger(int rank);
  // Frames sent and not yet received, over all pairs of ranks. A collective
  // that completed on every rank must leave none behind.
  size_t frames_in_flight() const;

 private:
  struct Queue {
    std::mutex mutex;
    std::condition_variable arrived;
    std::deque<tgpg::ReceivedFrame> frames;
  };
  class RankMessenger;

  Queue& queue(int src, int dst);
  void push(int src, int dst, tgpg::ReceivedFrame frame);
  tgpg::ReceivedFrame pop(int src, int dst, tgpg::Deadline deadline);

  const int world_;
  const MemoryOptions options_;
  std::vector<std::unique_ptr<Queue>> queues_;  // index src * world + dst
  std::vector<std::unique_ptr<RankMessenger>> messengers_;
};

}  // namespace tgpg_test
