#pragma once

#include <stdexcept>

namespace tgpg {

// A collective failed in a way the user must hear about: a mismatch between
// ranks, a dead or silent peer, a timeout. The message is meant for the user.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait for a peer ran past its deadline. Collective turns it into a
// CollectiveError that names the op and the peer.
class PeerTimeout : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

}  // namespace tgpg
