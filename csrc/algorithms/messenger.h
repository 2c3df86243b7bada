#pragma once

#include <chrono>
#include <memory>

#include "algorithms/frame.h"
#include "algorithms/send_tracker.h"

namespace tgpg {

using Deadline = std::chrono::steady_clock::time_point;

// What the collective algorithms need from a transport: ordered, reliable
// frames between any two ranks of a group. Frames from one peer arrive in the
// order that peer sent them.
class Messenger {
 public:
  virtual ~Messenger() = default;

  // Queues a frame and returns at once. The payload is sent without a copy:
  // it must stay unchanged until `tracker` sees it released.
  virtual void send(int dst, const FrameHeader& header, ByteView payload,
                    const std::shared_ptr<SendTracker>& tracker) = 0;

  // Blocks for the next frame from `src`. Throws CollectiveError when the peer
  // is gone, the group has failed, or the deadline passes.
  virtual ReceivedFrame recv(int src, Deadline deadline) = 0;

  // Tells every peer that this rank failed, so that they stop waiting for it.
  virtual void abort_peers(const std::string& reason) = 0;

  // What the next recv from `src` is for, so that a transport can show an
  // observer what a stuck rank waits for. Optional.
  virtual void expect(int src, const FrameHeader& expected) {}
};

}  // namespace tgpg
