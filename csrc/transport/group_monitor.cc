#include "transport/group_monitor.h"

#include <cstdio>
#include <sstream>

namespace tgpg {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

GroupMonitor::GroupMonitor(std::string group_key, int rank, int world, size_t recorder_size)
    : recorder_size_(recorder_size) {
  state_.group_key = std::move(group_key);
  state_.rank = rank;
  state_.world = world;
  state_.links.assign(world, "not connected");
  state_.links.at(rank) = "self";
}

OpRecord* GroupMonitor::find(uint64_t seq) {
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    if (it->seq == seq) return &*it;
  }
  return nullptr;
}

void GroupMonitor::op_issued(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.last_seq = std::max(state_.last_seq, seq);
}

void GroupMonitor::op_started(uint64_t seq, const std::string& op, const std::string& dtype, uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.last_seq = std::max(state_.last_seq, seq);
  if (recorder_size_ == 0) return;
  recent_.push_back(OpRecord{op, seq, dtype, count, now_seconds(), 0, "running"});
  while (recent_.size() > recorder_size_) recent_.pop_front();
}

void GroupMonitor::op_finished(uint64_t seq, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++state_.ops_done;
  if (OpRecord* r = find(seq)) {
    r->end = now_seconds();
    r->outcome = outcome;
  }
}

void GroupMonitor::sent(uint64_t bytes, bool through_shared_ring) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.bytes_sent += bytes;
  if (through_shared_ring) state_.bytes_sent_shared += bytes;
}

void GroupMonitor::received(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.bytes_received += bytes;
}

void GroupMonitor::begin_wait(int peer, const std::string& op, uint64_t seq, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.waiting = true;
  state_.wait = WaitRecord{peer, op, seq, offset, 0};
  wait_since_ = std::chrono::steady_clock::now();
}

void GroupMonitor::end_wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.waiting = false;
}

void GroupMonitor::set_link(int peer, const std::string& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (peer >= 0 && peer < state_.world) state_.links[peer] = state;
}

void GroupMonitor::set_failure(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_.failure.empty()) state_.failure = reason;
}

GroupSnapshot GroupMonitor::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  GroupSnapshot s = state_;
  if (s.waiting) s.wait.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_since_).count();
  s.recent.assign(recent_.begin(), recent_.end());
  return s;
}

std::string GroupMonitor::to_json() const {
  const GroupSnapshot s = snapshot();
  std::ostringstream out;
  out.precision(17);
  out << "{\"group_key\": " << json_string(s.group_key) << ", \"rank\": " << s.rank << ", \"world_size\": " << s.world
      << ", \"failure\": " << json_string(s.failure) << ", \"ops_done\": " << s.ops_done
      << ", \"last_seq\": " << s.last_seq << ", \"bytes_sent\": " << s.bytes_sent
      << ", \"bytes_sent_shared\": " << s.bytes_sent_shared << ", \"bytes_received\": " << s.bytes_received << ", \"links\": [";
  for (size_t i = 0; i < s.links.size(); ++i) out << (i ? ", " : "") << json_string(s.links[i]);
  out << "], \"waiting\": ";
  if (s.waiting) {
    out << "{\"peer\": " << s.wait.peer << ", \"op\": " << json_string(s.wait.op) << ", \"seq\": " << s.wait.seq
        << ", \"offset\": " << s.wait.offset << ", \"seconds\": " << s.wait.seconds << "}";
  } else {
    out << "null";
  }
  out << ", \"recent\": [";
  for (size_t i = 0; i < s.recent.size(); ++i) {
    const OpRecord& r = s.recent[i];
    out << (i ? ", " : "") << "{\"op\": " << json_string(r.op) << ", \"seq\": " << r.seq
        << ", \"dtype\": " << json_string(r.dtype) << ", \"count\": " << r.count << ", \"start\": " << r.start
        << ", \"end\": " << r.end << ", \"outcome\": " << json_string(r.outcome) << "}";
  }
  out << "]}\n";
  return out.str();
}

}  // namespace tgpg
