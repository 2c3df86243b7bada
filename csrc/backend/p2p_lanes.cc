#include "backend/p2p_lanes.h"

#include <algorithm>

namespace tgpg {

P2PLanes::P2PLanes(int world) : send_(world), recv_(world), received_(world, 0) {
  source_locks_.reserve(world);
  for (int i = 0; i < world; ++i) source_locks_.push_back(std::make_unique<std::mutex>());
}

P2PLanes::~P2PLanes() { finish_workers(std::chrono::seconds(1)); }

OpQueue& P2PLanes::lane(std::unique_ptr<OpQueue>& slot) {
  if (!slot) {
    slot = std::make_unique<OpQueue>();
    // A lane opened after close() refuses its jobs like the others.
    if (closed_) {
      for (auto& cancel : slot->close(reason_)) cancel();
    }
  }
  return *slot;
}

OpQueue& P2PLanes::send_lane(int dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  return lane(send_.at(dst));
}

OpQueue& P2PLanes::recv_lane(int src) {
  std::lock_guard<std::mutex> lock(mutex_);
  return lane(recv_.at(src));
}

OpQueue& P2PLanes::any_source_lane() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lane(any_source_);
}

std::vector<OpQueue*> P2PLanes::lanes() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<OpQueue*> all;
  for (auto* group : {&send_, &recv_}) {
    for (auto& slot : *group) {
      if (slot) all.push_back(slot.get());
    }
  }
  if (any_source_) all.push_back(any_source_.get());
  return all;
}

OpQueue::Cancelled P2PLanes::close(const std::string& reason, bool* running) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    reason_ = reason;
  }
  OpQueue::Cancelled cancelled;
  bool any_running = false;
  for (OpQueue* queue : lanes()) {
    bool lane_running = false;
    for (auto& cancel : queue->close(reason, &lane_running)) cancelled.push_back(std::move(cancel));
    any_running = any_running || lane_running;
  }
  if (running) *running = any_running;
  return cancelled;
}

void P2PLanes::wait_run_over(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (OpQueue* queue : lanes()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    queue->wait_run_over(std::max(left, std::chrono::milliseconds(0)));
  }
}

void P2PLanes::finish_workers(std::chrono::milliseconds grace) {
  for (OpQueue* queue : lanes()) queue->finish_worker(grace);
}

}  // namespace tgpg
