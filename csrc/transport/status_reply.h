#pragma once

#include <vector>

#include "torch_grpc_pg.pb.h"
#include "transport/group_monitor.h"

namespace tgpg {

// The rank that an observer (a monitoring tool, not a member) claims in its
// Hello; see StatusReply in protos/torch_grpc_pg.proto.
constexpr uint32_t kObserverRank = 0xffffffffu;

// This process and its groups, as an observer receives them.
torch_grpc_pg::Frame status_frame(const std::vector<GroupSnapshot>& groups);

}  // namespace tgpg
