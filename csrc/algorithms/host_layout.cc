#include "algorithms/host_layout.h"

#include <map>

namespace tgpg {

HostLayout::HostLayout(const std::vector<std::string>& host_ids)
    : host_of_(host_ids.size()), position_(host_ids.size()) {
  std::map<std::string, int> number;
  for (size_t rank = 0; rank < host_ids.size(); ++rank) {
    const auto [it, added] = number.emplace(host_ids[rank], static_cast<int>(hosts_.size()));
    if (added) hosts_.emplace_back();
    std::vector<int>& host = hosts_[it->second];
    host_of_[rank] = it->second;
    position_[rank] = static_cast<int>(host.size());
    host.push_back(static_cast<int>(rank));
  }
  two_level_ = hosts_.size() >= 2 && hosts_.front().size() >= 2;
  for (const auto& host : hosts_) two_level_ = two_level_ && host.size() == hosts_.front().size();
}

std::vector<int> HostLayout::counterparts(int rank) const {
  std::vector<int> ranks;
  ranks.reserve(hosts_.size());
  for (const auto& host : hosts_) ranks.push_back(host[position_[rank]]);
  return ranks;
}

}  // namespace tgpg
