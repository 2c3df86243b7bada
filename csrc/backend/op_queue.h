#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tgpg {

// Runs a process group's collectives one after another, in the order they were
// issued, on a thread of their own: the caller returns at once and computes
// while the collective runs. One thread keeps every rank's order identical.
//
// A job has two parts. `Run` is the part that uses the process group (the
// algorithm, the failure bookkeeping); it returns a `Finish` that completes the
// job's future, which may run user callbacks. The worker runs `Finish` after
// it has left the run part and outside every lock, so a callback may issue new
// work, destroy the group, or drop the group's last reference (the worker then
// detaches itself instead of joining itself: see finish_worker()). A job that
// will never run is failed through its `Cancel`, which must not use the group.
//
// The worker's state lives in a shared block that the thread holds too, so the
// thread can outlive the OpQueue object when it is detached.
class OpQueue {
 public:
  using Finish = std::function<void()>;
  using Run = std::function<Finish(uint64_t seq)>;
  using Cancel = std::function<void(uint64_t seq, const std::string& reason)>;
  // Cancellations taken out of the queue, for the caller to run outside every lock.
  using Cancelled = std::vector<std::function<void()>>;

  OpQueue();
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Assigns the next sequence number and queues the job under one lock, so that
  // two threads issuing at once cannot queue N+1 before N. Once the queue is
  // closed, the job is cancelled at once on this thread with the close reason.
  // Returns the job's sequence number.
  uint64_t push(Run run, Cancel cancel);
  // The sequence number of the last job pushed (0 before the first).
  uint64_t last_seq() const;
  // For a caller that waits for its job anyway (a blocking collective): when
  // no job is queued or running and the queue is open, takes the next sequence
  // number, tells it to `issued`, runs the job here on the calling thread as the
  // worker would (run part, then Finish outside every lock), and returns true.
  // Otherwise does nothing and returns false: the caller push()es as usual.
  // This saves the two thread hand-offs (wake the worker, wake the caller),
  // which are most of a small collective's time in the shared segment; the
  // order of jobs stays the order of their sequence numbers, because the worker
  // starts no job while this one is in its run part.
  bool run_here_if_idle(const Run& run, const Cancel& cancel, const std::function<void(uint64_t seq)>& issued);

  // Stops accepting and starting jobs; later pushes are cancelled with
  // `reason` (a later close only replaces the reason). Returns the queued
  // jobs' cancellations: the caller runs them outside its locks, and never
  // from inside a job's run part. `*running` tells whether a job is in its run
  // part now.
  Cancelled close(const std::string& reason, bool* running = nullptr);
  // Waits up to `limit` for the job in its run part, if any, to leave it.
  bool wait_run_over(std::chrono::milliseconds limit);
  // Closes the queue (if open) and ends the worker thread. Waits, without
  // bound, for a job's run part to end (it uses the owner's state), then up to
  // `grace` for the thread to exit, and joins it; detaches it instead when
  // called on the worker thread itself or when a job's Finish (user code) is
  // still running after `grace`.
  void finish_worker(std::chrono::milliseconds grace);
  bool on_worker_thread() const;

 private:
  struct Job {
    uint64_t seq = 0;
    Run run;
    Cancel cancel;
  };
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Job> jobs;
    uint64_t last_seq = 0;
    bool closed = false;
    std::string reason;
    bool in_run = false;  // a job is inside its Run, on the worker or a caller's thread
    bool exited = false;
  };

  static void run(const std::shared_ptr<Shared>& shared);
  static Cancelled take_queued(Shared& shared);

  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  std::thread::id worker_id_;
};

}  // namespace tgpg
