#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tgpg {

// Runs a process group's collectives one after another, in the order they were
// issued, on a thread of their own: the caller returns at once and computes
// while the collective runs. One thread keeps every rank's order identical.
class OpQueue {
 public:
  OpQueue();
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  void push(std::function<void()> job);
  // Waits for the queued jobs, then stops the thread.
  void stop();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tgpg
