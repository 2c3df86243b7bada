#include "backend/op_queue.h"

#include <utility>

#include "transport/thread_name.h"

namespace tgpg {

OpQueue::OpQueue() : shared_(std::make_shared<Shared>()) {
  thread_ = std::thread([shared = shared_] { run(shared); });
  worker_id_ = thread_.get_id();
}

OpQueue::~OpQueue() {
  try {
    for (auto& cancel : close("the process group was destroyed")) cancel();
  } catch (...) {
  }
  finish_worker(std::chrono::seconds(1));
}

uint64_t OpQueue::push(Run run, Cancel cancel) {
  uint64_t seq;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    seq = ++shared_->last_seq;
    if (!shared_->closed) {
      shared_->jobs.push_back(Job{seq, std::move(run), cancel});
      shared_->changed.notify_all();
      return seq;
    }
    reason = shared_->reason;
  }
  // Closed: the job fails now, on the caller's thread, outside the lock.
  cancel(seq, reason);
  return seq;
}

uint64_t OpQueue::last_seq() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->last_seq;
}

bool OpQueue::run_here_if_idle(const Run& run, const Cancel& cancel,
                               const std::function<void(uint64_t seq)>& issued) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->closed || shared_->in_run || !shared_->jobs.empty()) return false;
    seq = ++shared_->last_seq;
    shared_->in_run = true;
  }
  // Leaves the run part however it ends, so that the worker and close() never
  // wait on a job that is over.
  struct LeaveRun {
    Shared& shared;
    ~LeaveRun() {
      std::lock_guard<std::mutex> lock(shared.mutex);
      shared.in_run = false;
      shared.changed.notify_all();
    }
  };
  Finish finish;
  {
    LeaveRun leave{*shared_};
    try {
      issued(seq);
      finish = run(seq);
    } catch (...) {
      // As on the worker: anything escaping the run part fails the job.
      finish = [seq, cancel] { cancel(seq, "an unexpected internal error ended the job on the calling thread"); };
    }
  }
  try {
    if (finish) finish();
  } catch (...) {
    // As on the worker: a callback's exception is not this caller's.
  }
  return true;
}

OpQueue::Cancelled OpQueue::take_queued(Shared& shared) {
  Cancelled cancelled;
  cancelled.reserve(shared.jobs.size());
  for (Job& job : shared.jobs) {
    cancelled.push_back([seq = job.seq, cancel = std::move(job.cancel), reason = shared.reason] {
      cancel(seq, reason);
    });
  }
  shared.jobs.clear();
  return cancelled;
}

OpQueue::Cancelled OpQueue::close(const std::string& reason, bool* running) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->closed = true;
  shared_->reason = reason;
  if (running) *running = shared_->in_run;
  shared_->changed.notify_all();
  return take_queued(*shared_);
}

bool OpQueue::wait_run_over(std::chrono::milliseconds limit) {
  if (on_worker_thread()) return true;  // the worker is in a Finish, not in a Run
  std::unique_lock<std::mutex> lock(shared_->mutex);
  return shared_->changed.wait_for(lock, limit, [&] { return !shared_->in_run; });
}

bool OpQueue::on_worker_thread() const { return std::this_thread::get_id() == worker_id_; }

void OpQueue::finish_worker(std::chrono::milliseconds grace) {
  Cancelled cancelled;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (!shared_->closed) {
      shared_->closed = true;
      shared_->reason = "the process group was destroyed";
      cancelled = take_queued(*shared_);
    }
    shared_->changed.notify_all();
  }
  for (auto& cancel : cancelled) {
    try {
      cancel();
    } catch (...) {
    }
  }
  if (!thread_.joinable()) return;
  if (on_worker_thread()) {
    // The last reference was dropped by a Finish on the worker itself: it
    // cannot join itself. It only touches `shared` from here on and exits.
    try {
      thread_.detach();
    } catch (...) {
    }
    return;
  }
  bool exited;
  {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    shared_->changed.wait(lock, [&] { return !shared_->in_run; });
    exited = shared_->changed.wait_for(lock, grace, [&] { return shared_->exited; });
  }
  try {
    if (exited) {
      thread_.join();
    } else {
      // A user callback is still running in a Finish; it does not use the owner.
      thread_.detach();
    }
  } catch (...) {
  }
}

void OpQueue::run(const std::shared_ptr<Shared>& shared) {
  name_this_thread("tgpg-ops");
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(shared->mutex);
      // A job that a caller runs on its own thread (run_here_if_idle) holds
      // in_run: the next one waits for it, so that jobs run in their order.
      shared->changed.wait(lock, [&] { return shared->closed || (!shared->jobs.empty() && !shared->in_run); });
      if (shared->closed) break;
      job = std::move(shared->jobs.front());
      shared->jobs.pop_front();
      shared->in_run = true;
    }
    Finish finish;
    try {
      finish = job.run(job.seq);
    } catch (...) {
      // Run reports failures through its Finish; anything escaping it still
      // fails the job rather than the process.
      const uint64_t seq = job.seq;
      Cancel cancel = job.cancel;
      finish = [seq, cancel] { cancel(seq, "an unexpected internal error ended the job on the worker thread"); };
    }
    job.run = nullptr;  // release what the run part held before anything else runs
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->in_run = false;
      shared->changed.notify_all();
    }
    try {
      if (finish) finish();
    } catch (...) {
      // A callback's exception must not end the worker (std::terminate).
    }
    try {
      finish = nullptr;
      job = Job{};
    } catch (...) {
    }
  }
  std::lock_guard<std::mutex> lock(shared->mutex);
  shared->exited = true;
  shared->changed.notify_all();
}

}  // namespace tgpg
