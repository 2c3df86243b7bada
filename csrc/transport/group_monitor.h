#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace tgpg {

// One op as the flight recorder keeps it. Times are seconds since the epoch.
struct OpRecord {
  std::string op;
  uint64_t seq = 0;
  std::string dtype;
  uint64_t count = 0;
  double start = 0;
  double end = 0;               // 0 while it runs
  std::string outcome = "running";  // then "ok" or the error
};

// What a collective waits for right now.
struct WaitRecord {
  int peer = -1;
  std::string op;
  uint64_t seq = 0;
  uint64_t offset = 0;
  double seconds = 0;
};

struct GroupSnapshot {
  std::string group_key;
  int rank = 0;
  int world = 0;
  std::vector<std::string> links;
  uint64_t ops_done = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_sent_shared = 0;  // of bytes_sent, those copied into a peer's shared ring
  uint64_t bytes_received = 0;
  bool waiting = false;
  WaitRecord wait;
  std::string failure;
  std::vector<OpRecord> recent;
  uint64_t last_seq = 0;
};

// What a process group is doing, for observers: counters, the wait in
// progress, link states and a bounded flight recorder of its last ops. The
// worker thread, gRPC threads and a status request touch it concurrently; it
// includes neither torch nor gRPC, so the backend glue records ops here too.
class GroupMonitor {
 public:
  GroupMonitor(std::string group_key, int rank, int world, size_t recorder_size);

  // `seq` was issued on this rank: it is in the queue or running.
  void op_issued(uint64_t seq);
  void op_started(uint64_t seq, const std::string& op, const std::string& dtype, uint64_t count);
  void op_finished(uint64_t seq, const std::string& outcome);  // "ok" or the error

  void sent(uint64_t bytes, bool through_shared_ring);
  void received(uint64_t bytes);
  void begin_wait(int peer, const std::string& op, uint64_t seq, uint64_t offset);
  void end_wait();
  void set_link(int peer, const std::string& state);
  void set_failure(const std::string& reason);

  GroupSnapshot snapshot() const;
  // The snapshot as JSON, for the file written when a group fails.
  std::string to_json() const;

 private:
  OpRecord* find(uint64_t seq);  // mutex_ held

  mutable std::mutex mutex_;
  GroupSnapshot state_;
  size_t recorder_size_;
  std::deque<OpRecord> recent_;
  std::chrono::steady_clock::time_point wait_since_;
};

}  // namespace tgpg
