#include "backend/process_group_grpc.h"

#include <c10/util/Exception.h>

#include <random>
#include <sstream>

#include "algorithms/collective_error.h"
#include "transport/endpoint.h"

namespace tgpg {
namespace {

constexpr const char* kStorePrefix = "torch_grpc_pg/";

std::string store_string(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

void store_set(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, const std::string& value) {
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string random_hex() {
  std::random_device random;
  std::ostringstream out;
  out << std::hex << random() << random() << random() << random();
  return out.str();
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace

ProcessGroupGrpc::ProcessGroupGrpc(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   BackendOptions options)
    : c10d::Backend(rank, size), options_(std::move(options)) {
  TORCH_CHECK(rank >= 0 && rank < size, "grpc backend: rank ", rank, " is not in [0, ", size, ").");
  rendezvous(store);
}

ProcessGroupGrpc::~ProcessGroupGrpc() { shutdown(); }

void ProcessGroupGrpc::rendezvous(const c10::intrusive_ptr<c10d::Store>& store) {
  // Several groups may share one store prefix (a group re-created on the same
  // store): the arrival count tells which generation this one is.
  const int64_t arrival = store->add(std::string(kStorePrefix) + "arrivals", 1);
  const std::string generation = std::to_string((arrival - 1) / size_);
  const std::string prefix = std::string(kStorePrefix) + generation + "/";
  if (rank_ == 0) store_set(store, prefix + "instance", random_hex());
  const std::string group_key = options_.group_name + "#" + store_string(store, prefix + "instance");

  try {
    messenger_ = create_group_transport(options_.transport, group_key, rank_, size_);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "grpc backend on rank ", rank_, ": ", e.what());
  }
  store_set(store, prefix + "endpoint/" + std::to_string(rank_), messenger_->local_endpoint());
  std::vector<std::string> endpoints;
  endpoints.reserve(size_);
  for (int r = 0; r < size_; ++r) {
    const std::string key = prefix + "endpoint/" + std::to_string(r);
    try {
      store->wait({key}, options_.transport.connect_timeout);
    } catch (const std::exception&) {
      C10_THROW_ERROR(DistBackendError,
                      "grpc backend on rank " + std::to_string(rank_) + ": rank " + std::to_string(r) +
                          " did not publish its address within the connect timeout (" +
                          std::to_string(options_.transport.connect_timeout.count() / 1000) +
                          " s, TORCH_GRPC_PG_CONNECT_TIMEOUT). It may have failed to start: see its own error.");
    }
    endpoints.push_back(store_string(store, key));
  }
  try {
    messenger_->set_peer_endpoints(endpoints);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "grpc backend on rank ", rank_, ": ", e.what());
  }
  // Every peer now, not at the first send: address and credential problems
  // surface here, no collective stalls on a connect, and a failing rank can
  // reach every peer with its abort.
  for (int i = 1; i < size_; ++i) {
    const int peer = (rank_ + i) % size_;
    try {
      messenger_->connect(peer);
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, "grpc backend on rank " + std::to_string(rank_) + ": " + e.what());
    }
  }
}

std::string ProcessGroupGrpc::tcp_address() const {
  return Endpoint::parse(messenger_->local_endpoint()).tcp;
}

std::string ProcessGroupGrpc::unix_socket() const {
  return Endpoint::parse(messenger_->local_endpoint()).unix_path;
}

std::chrono::milliseconds ProcessGroupGrpc::timeout_of(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? options_.timeout : requested;
}

std::string ProcessGroupGrpc::where(const char* op) const {
  return std::string(op) + " on rank " + std::to_string(rank_);
}

Collective ProcessGroupGrpc::collective(OpType op, uint64_t seq, DType dtype, uint64_t count,
                                        std::chrono::milliseconds timeout, std::shared_ptr<void> keepalive,
                                        uint32_t root, std::optional<Reduction> reduction) {
  return Collective(*messenger_, rank_, size_, op, seq, dtype, count, timeout, options_.chunk_bytes,
                    std::make_shared<SendTracker>(std::move(keepalive)), root, reduction);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGrpc::enqueue(c10d::OpType type, const char* title,
                                                         const std::vector<at::Tensor>& inputs,
                                                         std::vector<at::Tensor> outputs,
                                                         std::chrono::milliseconds timeout, Body body) {
  auto work = c10::make_intrusive<GrpcWork>(rank_, type, title, inputs, std::move(outputs));
  const uint64_t seq = ++seq_;
  queue_.push([this, work, seq, timeout, title, body = std::move(body)] {
    try {
      if (messenger_->failed()) {
        throw CollectiveError(std::string(title) + " #" + std::to_string(seq) + " on rank " +
                              std::to_string(rank_) +
                              " cannot run: the process group failed earlier and is unusable (" +
                              messenger_->failure() +
                              "). Destroy it with destroy_process_group() and create a new one.");
      }
      body(seq, timeout);
      work->complete();
    } catch (const std::exception& e) {
      const std::string message = message_of(e);
      const bool first_failure = !messenger_->failed();
      messenger_->fail(message);
      work->fail(std::make_exception_ptr(c10::DistBackendError(message)));
      if (first_failure) messenger_->abort_peers(message);
    }
  });
  return work;
}

void ProcessGroupGrpc::shutdown() {
  queue_.stop();
  if (messenger_) messenger_->shut_down();
}

void ProcessGroupGrpc::abort() {
  if (messenger_) messenger_->fail("the process group was aborted on rank " + std::to_string(rank_));
  shutdown();
}

}  // namespace tgpg
