#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/frame.h"
#include "algorithms/messenger.h"

namespace tgpg {

// Lets the mailbox restart a paused stream reader once its queue has drained.
// `resume` must be safe to call after the stream has ended.
class ReadGate {
 public:
  virtual ~ReadGate() = default;
  virtual void resume() = 0;
};

// Frames received for one process group on this rank, queued per sending peer.
// Server threads deliver; the group's worker thread takes. Each queue is
// bounded in frames and in bytes: a full queue pauses that peer's stream, and
// HTTP/2 flow control then holds the sender back, so memory does not grow with
// tensor size.
class Mailbox {
 public:
  Mailbox(int rank, int world, size_t max_queued_frames, size_t max_queued_bytes);

  // Runs once, outside the mailbox's lock, on the first fail(): the group
  // uses it to tell its peers.
  void on_first_failure(std::function<void(const std::string&)> hook);

  // Server side. Returns false when the caller must stop reading until `gate`
  // is resumed.
  bool deliver(int src, ReceivedFrame frame, const std::shared_ptr<ReadGate>& gate);
  // The stream from `src` ended; a clean end too, since the group still expected it.
  void close_source(int src, const std::string& reason);
  // Fails every current and future wait, e.g. when a peer aborted or a link broke.
  void fail(const std::string& reason);
  // The process group is gone: drop what arrives from now on.
  void shut_down();

  // Worker side: the next frame from `src`. Throws CollectiveError (PeerTimeout
  // at the deadline).
  ReceivedFrame take(int src, Deadline deadline);
  // Worker side, for receives from any source: a peer with a frame queued,
  // taking turns among peers. Throws as take() does.
  int wait_any(Deadline deadline);
  bool has_frame(int src) const;

  bool failed() const;
  std::string failure() const;

 private:
  struct Source {
    std::deque<ReceivedFrame> frames;
    size_t bytes = 0;
    std::shared_ptr<ReadGate> paused;
    bool closed = false;
    std::string closed_reason;
  };

  const int rank_;
  const size_t max_queued_;
  const size_t max_queued_bytes_;
  std::function<void(const std::string&)> on_first_failure_;
  bool hook_running_ = false;  // shut_down waits for it: the hook may use its owner
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<Source> sources_;
  std::string failure_;
  bool shut_down_ = false;
  size_t next_any_ = 0;  // where wait_any starts looking, so no peer is starved
};

}  // namespace tgpg
