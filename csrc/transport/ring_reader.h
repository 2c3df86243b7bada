#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "transport/mailbox.h"
#include "same_host/shared_ring.h"

namespace tgpg {

// Reads one link's frames from the records of the sender's shared ring, once
// the sender has switched to them, and delivers them to the group's mailbox,
// on a thread of its own that sleeps on the ring's futex between records. It
// pauses while the mailbox's queue for the sender is full, as a paused stream
// does, and the sender then waits for a record to come back. Each record is
// decoded and checked as a frame from the stream is; a record that fails the
// checks fails the group.
class RingReader {
 public:
  struct Events {
    // After end(): every record appended before the stream ended has been
    // delivered, and the mailbox's source is closed.
    std::function<void()> drained;
    // A record was refused; the mailbox has failed with `reason` already.
    std::function<void(const std::string& reason)> refused;
  };

  RingReader(std::shared_ptr<ReceiveRing> ring, std::shared_ptr<Mailbox> mailbox, int src, size_t max_payload_bytes,
             Events events);
  // Stops and joins the thread (or, when an event destroys the reader on the
  // reader's own thread, lets the thread end on its own).
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  // The sender's stream ended: deliver what it appended before, then close
  // the mailbox's source with `reason`.
  void end(const std::string& reason);
  // Stops at once; what is unread is dropped. The caller closes or fails the source.
  void stop();

 private:
  class Resumer;

  void run();
  // Delivers one record; false if it was refused, after which the reader may
  // be gone: the caller returns at once.
  bool deliver(const std::string& record);
  void refuse(const std::string& reason);

  std::shared_ptr<ReceiveRing> ring_;
  std::shared_ptr<Mailbox> mailbox_;
  const int src_;
  const size_t max_payload_bytes_;
  Events events_;
  std::shared_ptr<Resumer> resumer_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ending_{false};
  std::mutex mutex_;
  std::string end_reason_;
  std::thread thread_;
};

}  // namespace tgpg
