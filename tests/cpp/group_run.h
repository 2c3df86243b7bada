#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/collective.h"
#include "memory_messenger.h"

namespace tgpg_test {

// What one rank passes to the Collective constructor, apart from the messenger
// and its rank: the fields that the ranks of a group must agree on.
struct Call {
  tgpg::OpType op = tgpg::OpType::Allreduce;
  tgpg::DType dtype = tgpg::DType::Float32;
  uint64_t count = 0;
  size_t chunk_bytes = 64;
  uint32_t root = 0;
  std::optional<tgpg::Reduction> reduction;
  uint64_t seq = 1;
  std::chrono::milliseconds timeout{10000};
  // Collective::use_wire_dtype(wire, remote) when `remote` is not empty.
  tgpg::DType wire = tgpg::DType::Float32;
  std::vector<bool> remote;
};

tgpg::Collective make_collective(tgpg::Messenger& messenger, int rank, int world, const Call& call);

// "allreduce float32 count=7 chunk=8B root=0 SUM"
std::string describe(const Call& call);

// The in-memory transports the tests rotate through, so that every kind of
// case meets each of them without multiplying the number of cases.
MemoryOptions transport_variant(size_t index);
std::string describe(const MemoryOptions& options);

// Runs `body` on every rank of a fresh in-memory group, each rank with its own
// Collective made from calls[rank], then waits for that rank's sends to be
// released as the backend does. Returns what each rank threw.
struct GroupResult {
  std::vector<std::exception_ptr> errors;
  size_t frames_left = 0;  // sent but never received
};
GroupResult run_group(const std::vector<Call>& calls, const MemoryOptions& options,
                      const std::function<void(tgpg::Collective&, int rank)>& body);

}  // namespace tgpg_test
