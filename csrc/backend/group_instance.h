#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace tgpg {

// Which instance of a group a rank joins, on a store that may still hold the
// keys of earlier instances of the same group.
//
// A store outlives the group on it: a group re-created on the same store, and
// torchrun, which restarts every worker of a job on the same store after one
// failed. A count of arrivals cannot tell the instances apart once an earlier
// one was left short (a rank that died before it created its group): every
// later count is off by the ranks that never came, and so is every later
// instance. So rank 0 opens each instance under a fresh random name and gives it
// to each peer in answer to a fresh random nonce of that peer's; a key left by
// an earlier instance may be answered (harmlessly: nobody waits on it) but is
// never read as this one's.
//
//   peer r:  set hello/r = nonce; wait for welcome/r/nonce -> the instance's name;
//            set <name>/joined/r
//   rank 0:  name = new_instance_name(); publish its own address under it; then
//            admit_peers: answer each hello/r as it appears with welcome/r/<nonce>,
//            reading hello/r again until <name>/joined/r appears (each peer on
//            its own: one that is late or never comes holds up no other)

// A fresh random name (128 bits, hex).
std::string new_instance_name();

// Rank 0: answers the peers' hellos until every peer has joined the instance
// `name` or `deadline` has passed. Returns, by rank, the peers that did not
// join: they publish nothing under `name`.
std::vector<bool> admit_peers(const c10::intrusive_ptr<c10d::Store>& store, const std::string& base,
                              const std::string& name, int size, std::chrono::steady_clock::time_point deadline);

// A peer: the name of the instance rank 0 admitted it to, or "" if rank 0 did
// not answer by `deadline`.
std::string join_instance(const c10::intrusive_ptr<c10d::Store>& store, const std::string& base, int rank,
                          std::chrono::steady_clock::time_point deadline);

}  // namespace tgpg
