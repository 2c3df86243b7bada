#include "backend/process_group_grpc.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <c10/util/Exception.h>

#include <algorithm>
#include <future>
#include <sstream>

#include "algorithms/collective_error.h"
#include "backend/group_instance.h"
#include "backend/store_access.h"
#include "transport/endpoint.h"
#include "transport/run_together.h"

namespace tgpg {
namespace {

constexpr const char* kStorePrefix = "torch_grpc_pg/";

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// `now() + timeout` must not overflow steady_clock (nanoseconds) for a
// timedelta.max-like timeout: a year is as good as forever here. Such a
// timeout may also arrive negative: timedelta.max overflows on its way from
// Python (in microseconds) and wraps. No caller means a negative timeout (the
// "unset" marker is resolved before this), so it counts as a huge one too.
constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 365);

std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) return kMaxTimeout;
  return std::min(timeout, kMaxTimeout);
}

// A group's own timeout: "unset" means the default.
std::chrono::milliseconds group_timeout(std::chrono::milliseconds timeout) {
  return timeout == c10d::kUnsetTimeout ? BackendOptions().timeout : clamp_timeout(timeout);
}

// How long shutdown() lets a running job, woken by the transport's failure,
// leave the part that uses the transport before the transport shuts down.
constexpr std::chrono::milliseconds kRunGrace{500};
// How long the destructor waits for the worker to leave a user callback.
constexpr std::chrono::milliseconds kWorkerExitGrace{1000};

constexpr const char* kOk = "ok";
constexpr const char* kFailedPrefix = "failed: ";

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}

std::string failed_text(const std::string& reason) {
  return "the process group failed earlier and is unusable (" + reason +
         "). Destroy it with destroy_process_group() and create a new one.";
}

// "grpc:all_reduce #3 on rank 1": how a message names an op of this rank.
std::string op_on_rank(const char* title, uint64_t seq, int rank) {
  return std::string(title) + " #" + std::to_string(seq) + " on rank " + std::to_string(rank);
}

std::string cannot_run(const char* title, uint64_t seq, int rank, const std::string& why) {
  return op_on_rank(title, seq, rank) + " cannot run: " + why;
}

}  // namespace

ProcessGroupGrpc::ProcessGroupGrpc(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   BackendOptions options)
    : c10d::Backend(rank, size), options_(std::move(options)), lanes_(size) {
  TORCH_CHECK(rank >= 0 && rank < size, "grpc backend: rank ", rank, " is not in [0, ", size, ").");
  options_.timeout = group_timeout(options_.timeout);
  timeout_ms_.store(options_.timeout.count());
  options_.transport.connect_timeout = clamp_timeout(options_.transport.connect_timeout);
  rendezvous(store);
  state_.ready();
}

ProcessGroupGrpc::~ProcessGroupGrpc() {
  // Safe on any thread, the worker included (a future callback that drops
  // the last reference): shutdown() never waits for a callback, and the queue
  // detaches rather than joins its own thread.
  try {
    shutdown();
  } catch (...) {
  }
  queue_.finish_worker(kWorkerExitGrace);
  lanes_.finish_workers(kWorkerExitGrace);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupGrpc::getBackendOptions() {
  auto options = c10::make_intrusive<Options>(getBackendName(), std::chrono::milliseconds(timeout_ms_.load()));
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 9
  options->group_name = options_.group_name;  // a field since 2.9
#endif
  return options;
}

void ProcessGroupGrpc::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ms_.store(group_timeout(timeout).count());
}

// Initializing (group_state.h): connect, report, wait for every report, decide together.
void ProcessGroupGrpc::rendezvous(const c10::intrusive_ptr<c10d::Store>& store) {
  const std::chrono::milliseconds bound = options_.transport.connect_timeout;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  // The store may hold earlier instances of this group (group_instance.h).
  const std::string instance = rank_ == 0 ? new_instance_name() : join_instance(store, kStorePrefix, rank_, deadline);
  if (instance.empty()) {
    C10_THROW_ERROR(DistBackendError,
                    "grpc backend on rank " + std::to_string(rank_) + ": creating process group '" +
                        options_.group_name + "' of " + std::to_string(size_) + " ranks failed: rank 0 did not " +
                        "open the group within the connect timeout (" + seconds_text(bound) +
                        ", TORCH_GRPC_PG_CONNECT_TIMEOUT); it may have crashed or hung before creating this group, "
                        "or still be starting. Check rank 0's log, or raise the timeout if it starts slowly.");
  }
  const std::string prefix = std::string(kStorePrefix) + instance + "/";
  const std::string group_key = options_.group_name + "#" + instance;
  // This rank's outcome: "" when it could reach every peer.
  std::string failure;
  try {
    messenger_ = create_group_transport(options_.transport, group_key, rank_, size_);
    // Point-to-point messages keep one connection per peer: receives from any
    // source wait on every peer's one queue.
    TransportConfig p2p_config = options_.transport;
    p2p_config.connections_per_peer = 1;
    p2p_ = create_group_transport(p2p_config, group_key + "/p2p", rank_, size_);
    // The group fails as one: whichever transport fails first fails the other.
    const auto couple = [](const std::shared_ptr<GroupTransport>& from, const std::shared_ptr<GroupTransport>& to) {
      from->add_failure_listener([weak = std::weak_ptr<GroupTransport>(to)](const std::string& reason) {
        if (auto other = weak.lock()) other->fail(reason);
      });
    };
    couple(messenger_, p2p_);
    couple(p2p_, messenger_);
  } catch (const std::exception& e) {
    failure = "could not start its transport: " + message_of(e);
  }
  // An empty address tells peers not to wait for, or dial, a rank that failed to start.
  store_set(store, prefix + "endpoint/" + std::to_string(rank_),
            failure.empty() ? messenger_->local_endpoint() : std::string());
  // Never published an address within `bound`. Rank 0 publishes its own before
  // it admits the peers, so that every peer that joins finds it.
  std::vector<bool> absent =
      rank_ == 0 ? admit_peers(store, kStorePrefix, instance, size_, deadline) : std::vector<bool>(size_, false);
  if (failure.empty()) failure = connect_peers(store, prefix, absent, deadline);
  // The shared segment, where every rank lives on this host; reported before
  // the outcome, so that every rank reads every report once outcomes are in.
  const bool segment = failure.empty() && wants_segment();
  if (segment) report_segment(store, prefix, map_segment(store, prefix));
  else if (rank_ == 0) store_set(store, prefix + "segment", kNoSegment);

  // Report, then keep the server up until every rank that is coming has
  // reported (or `bound` has passed), so that no peer still connecting finds
  // this rank gone and every rank decides on the same reports.
  store_set(store, prefix + "outcome/" + std::to_string(rank_),
            failure.empty() ? std::string(kOk) : kFailedPrefix + failure);
  std::vector<std::string> awaited;
  for (int r = 0; r < size_; ++r) {
    if (!absent[r]) awaited.push_back(prefix + "outcome/" + std::to_string(r));
  }
  // The ranks missing are named below.
  const bool all_reported = store_wait_for(store, awaited, bound) && awaited.size() == static_cast<size_t>(size_);

  // Every report in one read: each rank's outcome, and where the segment is
  // wanted, whether each rank mapped it. Outcomes that every rank wrote are
  // read straight away (a round trip less across a long link); a report
  // that may be missing is looked for first, so that no read waits for it.
  std::vector<std::string> report_keys;
  for (int r = 0; r < size_; ++r) report_keys.push_back(prefix + "outcome/" + std::to_string(r));
  for (int r = 0; r < size_ && segment; ++r) report_keys.push_back(prefix + "segment/" + std::to_string(r));
  std::vector<std::optional<std::string>> reports;
  if (all_reported && !segment) {
    for (std::string& value : store_strings(store, report_keys)) reports.emplace_back(std::move(value));
  } else {
    reports = store_strings_present(store, report_keys);
  }
  std::vector<std::string> failures;
  for (int r = 0; r < size_; ++r) {
    const std::optional<std::string>& outcome = reports[r];
    if (!outcome) {
      failures.push_back(
          "rank " + std::to_string(r) + ": " +
          (absent[r] ? "did not publish its address within the connect timeout (" + seconds_text(bound) +
                           ", TORCH_GRPC_PG_CONNECT_TIMEOUT); it may have crashed or hung before creating this "
                           "group, or still be starting"
                     : "did not report the outcome of its setup within " + seconds_text(bound) +
                           " (TORCH_GRPC_PG_CONNECT_TIMEOUT) of rank " + std::to_string(rank_) +
                           "'s report; it may have crashed or hung, or still be connecting"));
      continue;
    }
    if (*outcome == kOk) continue;
    const std::string reason =
        outcome->rfind(kFailedPrefix, 0) == 0 ? outcome->substr(std::string(kFailedPrefix).size()) : *outcome;
    failures.push_back("rank " + std::to_string(r) + ": " + reason);
  }
  if (failures.empty()) {
    if (segment) decide_segment({reports.begin() + size_, reports.end()});
    publish_server(store);
    return;
  }
  std::ostringstream message;
  message << "grpc backend on rank " << rank_ << ": creating process group '" << options_.group_name
          << "' of " << size_ << " ranks failed; every rank of the group raises this error. "
          << (failures.size() == 1 ? "The failure:" : "The failures:");
  for (const auto& line : failures) message << "\n  " << line;
  C10_THROW_ERROR(DistBackendError, message.str());
}

// Monitoring tools (python -m torch_grpc_pg.status --store) find every rank's
// server here, at the root of the job's store, whatever prefix this group has.
void ProcessGroupGrpc::publish_server(const c10::intrusive_ptr<c10d::Store>& store) const {
  c10::intrusive_ptr<c10d::Store> root = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(root.get())) root = prefixed->getUnderlyingNonPrefixStore();
  try {
    const int64_t index = root->add("torch_grpc_pg/servers/count", 1);
    store_set(root, "torch_grpc_pg/servers/" + std::to_string(index), tcp_address());
  } catch (const std::exception&) {
    // Observers lose a convenience; the group itself is fine.
  }
}

std::string ProcessGroupGrpc::connect_peers(const c10::intrusive_ptr<c10d::Store>& store,
                                            const std::string& prefix, std::vector<bool>& absent,
                                            std::chrono::steady_clock::time_point deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(prefix + "endpoint/" + std::to_string(r));
  const bool any_absent = std::find(absent.begin(), absent.end(), true) != absent.end();
  if (any_absent || !store_wait_for(store, keys, left_until(deadline))) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < size_; ++r) {
      if (!absent[r] && store->check({keys[r]})) continue;
      absent[r] = true;
      missing += (count++ == 0 ? "" : ", ") + std::to_string(r);
    }
    return (count == 1 ? "rank " : "ranks ") + missing + " did not publish an address within the connect timeout (" +
           seconds_text(options_.transport.connect_timeout) + ", TORCH_GRPC_PG_CONNECT_TIMEOUT)";
  }
  const std::vector<std::string> endpoints = store_strings(store, keys);
  const bool peer_failed_to_start =
      std::any_of(endpoints.begin(), endpoints.end(), [](const std::string& e) { return e.empty(); });
  // That rank reports its own reason; there is nothing to connect to.
  if (peer_failed_to_start) return "";
  try {
    messenger_->set_peer_endpoints(endpoints);
    p2p_->set_peer_endpoints(endpoints);
    hosts_ = HostLayout(messenger_->host_ids());
    if (options_.two_level) allreduce_hosts_ = hosts_;
    remote_.assign(static_cast<size_t>(size_), false);
    for (int r = 0; r < size_ && hosts_.world() == size_; ++r) remote_[r] = hosts_.host_of(r) != hosts_.host_of(rank_);
  } catch (const std::exception& e) {
    return message_of(e);
  }
  // Every peer now, not at the first send: address and credential problems
  // surface here, no collective stalls on a connect, and a failing rank can
  // reach every peer with its abort.
  // The point-to-point streams too, though they may never carry a message: a
  // rank's place on a peer is taken by the first stream that claims it, so one
  // left for later would be a stranger's to take until the first send.
  // All at once: each link's handshake is a few round trips, which overlap.
  std::vector<std::function<void()>> connects;
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + i) % size_;
    connects.emplace_back([this, peer] { messenger_->connect(peer); });
    connects.emplace_back([this, peer] { p2p_->connect(peer); });
  }
  try {
    run_together(std::move(connects));
  } catch (const std::exception& e) {
    return message_of(e);
  }
  return "";
}

std::string ProcessGroupGrpc::tcp_address() const {
  return Endpoint::parse(messenger_->local_endpoint()).tcp;
}

std::string ProcessGroupGrpc::failure() const {
  std::string reason = state_.failure();
  if (!reason.empty()) return reason;
  // A destroyed group's transport reports its own closing as a failure: not one.
  if (state_.phase() == GroupState::Phase::Ready && messenger_ && messenger_->failed()) {
    return messenger_->failure();
  }
  return "";
}

std::string ProcessGroupGrpc::unix_socket() const {
  return Endpoint::parse(messenger_->local_endpoint()).unix_path;
}

std::chrono::milliseconds ProcessGroupGrpc::timeout_of(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? std::chrono::milliseconds(timeout_ms_.load())
                                          : clamp_timeout(requested);
}

std::string ProcessGroupGrpc::where(const char* op) const {
  return std::string(op) + " on rank " + std::to_string(rank_);
}

void ProcessGroupGrpc::narrow_between_hosts(Collective& c) const {
  if (narrows_between_hosts(c.dtype())) c.use_wire_dtype(options_.wire_dtype, remote_);
}

bool ProcessGroupGrpc::narrows_between_hosts(DType dtype) const {
  if (dtype != DType::Float32 || options_.wire_dtype == DType::Float32) return false;
  if (remote_.size() != static_cast<size_t>(size_)) return false;
  for (bool remote : remote_) {
    if (remote) return true;
  }
  return false;
}

Collective ProcessGroupGrpc::collective(OpType op, uint64_t seq, DType dtype, uint64_t count,
                                        std::chrono::milliseconds timeout, std::shared_ptr<void> keepalive,
                                        uint32_t root, std::optional<Reduction> reduction) {
  // A peer that runs this op in the shared segment must hear at once that this
  // rank runs it over the links (messages between two ranks are not the group's ops).
  if (segment_ && op != OpType::PointToPoint) {
    segment_->announce_elsewhere(descriptor(op, seq, dtype, count, root, reduction));
  }
  return Collective(*messenger_, rank_, size_, op, seq, dtype, count, timeout, options_.chunk_bytes,
                    std::make_shared<SendTracker>(std::move(keepalive)), root, reduction);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::enqueue(c10d::OpType type, const char* title,
                                                         const std::vector<at::Tensor>& inputs,
                                                         std::vector<at::Tensor> outputs,
                                                         std::chrono::milliseconds timeout, Body body, bool here) {
  auto work = c10::make_intrusive<GrpcWork>(rank_, type, title, inputs, std::move(outputs));
  issue(queue_, *messenger_, work, title, inputs, timeout, std::move(body), here);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::issue(OpQueue& queue, GroupTransport& transport,
                                                       const c10::intrusive_ptr<GrpcWork>& work, const char* title,
                                                       const std::vector<at::Tensor>& inputs,
                                                       std::chrono::milliseconds timeout, Body body, bool here) {
  // A failure the transport found on its own (a broken link, a peer's abort)
  // fails the group now, so this call fails at once with that reason.
  if (state_.phase() == GroupState::Phase::Ready && messenger_->failed()) {
    for (const auto& cancel : enter_failed(messenger_->failure())) cancel();
  }
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    if (coalescing_) coalesced_.push_back(work->getFuture());
    // A coalesced op's caller waits for the group of them, not for this one.
    here = here && !coalescing_;
  }
  const int rank = rank_;
  OpQueue::Cancel cancel = [work, title, rank](uint64_t seq, const std::string& why) {
    work->fail(std::make_exception_ptr(c10::DistBackendError(cannot_run(title, seq, rank, why))));
  };
  // What the flight recorder shows of this op (group_monitor.h).
  OpSummary summary{inputs.empty() ? "" : std::string(c10::toString(inputs[0].scalar_type())),
                    inputs.empty() ? 0 : static_cast<uint64_t>(inputs[0].numel())};
  OpQueue::Run run = [this, &transport, work, title, timeout, summary, body = std::move(body)](uint64_t seq) {
    return run_job(transport, work, title, seq, timeout, summary, body);
  };
  // Sequence numbers in the status are the collectives'; each lane counts its own.
  const auto issued = [this, &queue](uint64_t seq) {
    if (&queue == &queue_) messenger_->monitor().op_issued(seq);
  };
  if (here && queue.run_here_if_idle(run, cancel, issued)) return work;
  issued(queue.push(std::move(run), std::move(cancel)));
  return work;
}

OpQueue::Finish ProcessGroupGrpc::run_job(GroupTransport& transport, const c10::intrusive_ptr<GrpcWork>& work,
                                          const char* title, uint64_t seq, std::chrono::milliseconds timeout,
                                          const OpSummary& summary, const Body& body) {
  GroupMonitor& monitor = transport.monitor();
  monitor.op_started(seq, std::string(title).substr(std::string(title).rfind(':') + 1), summary.dtype, summary.count);
  std::string error;
  std::string group_reason;  // what the group had failed of before this job ran
  try {
    if (messenger_->failed()) {
      group_reason = messenger_->failure();
      error = cannot_run(title, seq, rank_, failed_text(group_reason));
    } else {
      body(seq, timeout);
    }
  } catch (const CollectiveError& e) {
    error = e.what();  // names the op, its number and the ranks
  } catch (const std::exception& e) {
    // Anything else (copying the result into the caller's tensor, memory)
    // knows nothing of the op, which the message must still name.
    error = op_on_rank(title, seq, rank_) + " failed: " + message_of(e);
  } catch (...) {
    error = op_on_rank(title, seq, rank_) + " failed with an exception of unknown type";
  }
  monitor.op_finished(seq, error.empty() ? "ok" : error);
  if (error.empty()) return [work] { work->complete(); };
  OpQueue::Cancelled cancelled;
  try {
    cancelled = enter_failed(group_reason.empty() ? error : group_reason);
  } catch (...) {
  }
  auto exception = std::make_exception_ptr(c10::DistBackendError(error));
  // Runs after the job has left its run part: from here on nothing touches
  // this object, which a callback may destroy.
  return [work, exception, cancelled = std::move(cancelled)] {
    work->fail(exception);
    for (const auto& cancel : cancelled) {
      try {
        cancel();
      } catch (...) {
      }
    }
  };
}

OpQueue::Cancelled ProcessGroupGrpc::enter_failed(const std::string& reason) {
  if (!state_.fail(reason)) return {};
  // The transport sends its first failure to every peer, so that none waits
  // out its timeout for this rank.
  messenger_->fail(reason);
  p2p_->fail(reason);
  OpQueue::Cancelled cancelled = queue_.close(failed_text(reason));
  for (auto& cancel : lanes_.close(failed_text(reason))) cancelled.push_back(std::move(cancel));
  return cancelled;
}

std::string ProcessGroupGrpc::unusable_reason() const {
  const std::string failure = state_.failure();
  if (!failure.empty()) {
    return "the process group failed earlier (" + failure + ") and has been destroyed since";
  }
  return "the process group was destroyed on rank " + std::to_string(rank_) +
         " (destroy_process_group(), shutdown() or abort())";
}

// Destroyed (group_state.h), in this order: fail queued and running work, let
// the worker leave the running job, then close the transport.
void ProcessGroupGrpc::shutdown() {
  if (state_.destroy() == GroupState::Phase::Destroyed) return;
  if (!messenger_) return;
  const std::string reason = unusable_reason();
  bool running = false;
  bool lane_running = false;
  OpQueue::Cancelled cancelled = queue_.close(reason, &running);
  for (auto& cancel : lanes_.close(reason, &lane_running)) cancelled.push_back(std::move(cancel));
  // A job waiting for a peer wakes now rather than at its timeout.
  if (running || lane_running) {
    try {
      messenger_->fail(reason);
    } catch (...) {
    }
  }
  for (const auto& cancel : cancelled) {
    try {
      cancel();
    } catch (...) {
    }
  }
  const auto grace_end = std::chrono::steady_clock::now() + kRunGrace;
  queue_.wait_run_over(kRunGrace);
  lanes_.wait_run_over(
      std::max(std::chrono::duration_cast<std::chrono::milliseconds>(grace_end - std::chrono::steady_clock::now()),
               std::chrono::milliseconds(0)));
  // Both transports at once, so that destroy stays within one close timeout.
  const auto close = [](const std::shared_ptr<GroupTransport>& transport) {
    try {
      if (transport) transport->shut_down();
    } catch (...) {
    }
  };
  std::future<void> p2p_closed;
  try {
    p2p_closed = std::async(std::launch::async, close, p2p_);
  } catch (...) {
    close(p2p_);  // no thread to spare: one after the other
  }
  close(messenger_);
  if (p2p_closed.valid()) p2p_closed.wait();
}

void ProcessGroupGrpc::abort() {
  if (messenger_ && state_.phase() != GroupState::Phase::Destroyed) {
    OpQueue::Cancelled cancelled;
    try {
      cancelled = enter_failed("the process group was aborted on rank " + std::to_string(rank_));
    } catch (...) {
    }
    for (const auto& cancel : cancelled) {
      try {
        cancel();
      } catch (...) {
      }
    }
  }
  shutdown();
}

}  // namespace tgpg
