#include "group_run.h"

#include <memory>
#include <sstream>

#include "rank_threads.h"

namespace tgpg_test {

tgpg::Collective make_collective(tgpg::Messenger& messenger, int rank, int world, const Call& call) {
  tgpg::Collective c(messenger, rank, world, call.op, call.seq, call.dtype, call.count, call.timeout,
                     call.chunk_bytes, std::make_shared<tgpg::SendTracker>(nullptr), call.root, call.reduction);
  if (!call.remote.empty()) c.use_wire_dtype(call.wire, call.remote);
  return c;
}

std::string describe(const Call& call) {
  std::ostringstream out;
  out << tgpg::op_name(call.op) << " " << tgpg::dtype_name(call.dtype) << " count=" << call.count
      << " chunk=" << call.chunk_bytes << "B root=" << call.root << " "
      << tgpg::reduction_name(tgpg::reduction_code(call.reduction));
  return out.str();
}

MemoryOptions transport_variant(size_t index) {
  MemoryOptions options;
  options.zero_copy = (index & 1) != 0;
  options.split_payloads = (index & 2) != 0;
  return options;
}

std::string describe(const MemoryOptions& options) {
  return std::string(options.zero_copy ? "zero-copy" : "copying") +
         (options.split_payloads ? ", split payloads" : ", whole payloads");
}

GroupResult run_group(const std::vector<Call>& calls, const MemoryOptions& options,
                      const std::function<void(tgpg::Collective&, int rank)>& body) {
  const int world = static_cast<int>(calls.size());
  MemoryNetwork network(world, options);
  GroupResult result;
  result.errors = run_on_ranks(world, [&](int rank) {
    tgpg::Collective c = make_collective(network.messenger(rank), rank, world, calls[rank]);
    body(c, rank);
    c.wait_sends_released();
  });
  result.frames_left = network.frames_in_flight();
  return result;
}

}  // namespace tgpg_test
