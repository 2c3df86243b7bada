#pragma once

#include <string>
#include <vector>

namespace tgpg {

// Which ranks of a group share a host. A flat ring that spans hosts sends every
// byte across the link between two hosts once for each rank on the border; an
// allreduce in two levels (inside each host, then across) sends it once per host.
class HostLayout {
 public:
  HostLayout() = default;  // nothing known: every schedule stays flat
  // `host_ids[r]` names the host of rank r; ranks with equal names share one.
  explicit HostLayout(const std::vector<std::string>& host_ids);

  int world() const { return static_cast<int>(host_of_.size()); }
  // At least two hosts, each with the same number (at least two) of ranks.
  // With one rank per host the flat ring is already the two-level schedule;
  // hosts of unequal sizes would leave some ranks without a counterpart.
  bool two_level() const { return two_level_; }
  // The ranks on `rank`'s host, in rank order.
  const std::vector<int>& local_ranks(int rank) const { return hosts_[host_of_[rank]]; }
  // `rank`'s index in local_ranks(rank).
  int position_on_host(int rank) const { return position_[rank]; }
  // Hosts are numbered in the order of their lowest rank.
  int host_of(int rank) const { return host_of_[rank]; }
  // The rank at `rank`'s position on every host, by host number.
  std::vector<int> counterparts(int rank) const;

 private:
  std::vector<std::vector<int>> hosts_;
  std::vector<int> host_of_;
  std::vector<int> position_;
  bool two_level_ = false;
};

}  // namespace tgpg
