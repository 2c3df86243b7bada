#include "transport/status_reply.h"

#include <unistd.h>

#include <chrono>

namespace tgpg {

torch_grpc_pg::Frame status_frame(const std::vector<GroupSnapshot>& groups) {
  torch_grpc_pg::Frame frame;
  auto* reply = frame.mutable_status();
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  reply->set_host(host);
  reply->set_pid(static_cast<uint32_t>(::getpid()));
  reply->set_time(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  for (const GroupSnapshot& g : groups) {
    auto* out = reply->add_groups();
    out->set_group_key(g.group_key);
    out->set_rank(static_cast<uint32_t>(g.rank));
    out->set_world_size(static_cast<uint32_t>(g.world));
    for (const auto& link : g.links) out->add_links(link);
    out->set_ops_done(g.ops_done);
    out->set_bytes_sent(g.bytes_sent);
    out->set_bytes_received(g.bytes_received);
    out->set_bytes_sent_shared(g.bytes_sent_shared);
    out->set_failure(g.failure);
    out->set_last_seq(g.last_seq);
    if (g.waiting) {
      auto* wait = out->mutable_waiting();
      wait->set_peer(static_cast<uint32_t>(g.wait.peer));
      wait->set_op(g.wait.op);
      wait->set_seq(g.wait.seq);
      wait->set_offset(g.wait.offset);
      wait->set_seconds(g.wait.seconds);
    }
    for (const OpRecord& r : g.recent) {
      auto* rec = out->add_recent();
      rec->set_op(r.op);
      rec->set_seq(r.seq);
      rec->set_dtype(r.dtype);
      rec->set_count(r.count);
      rec->set_start(r.start);
      rec->set_end(r.end);
      rec->set_outcome(r.outcome);
    }
  }
  return frame;
}

}  // namespace tgpg
