#include "transport/rank_server.h"

#include <grpc/grpc.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "torch_grpc_pg.grpc.pb.h"
#include "transport/channel_options.h"
#include "transport/endpoint.h"
#include "transport/exchange_reactor.h"
#include "transport/frame_protection.h"
#include "transport/malloc_tuning.h"
#include "transport/socket_dir.h"
#include "transport/wire_format.h"

namespace tgpg {
namespace {

using ServiceBase = torch_grpc_pg::ProcessGroupService::WithRawCallbackMethod_Exchange<
    torch_grpc_pg::ProcessGroupService::Service>;

// gRPC's reflection plugin, once registered, joins every server the process
// builds; this option takes it out of one server's plugins again.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const auto& plugin) { return plugin->name() == "proto_server_reflection"; }),
                   plugins->end());
  }
};

std::mutex& current_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::weak_ptr<RankServer>& current_server() {
  static std::weak_ptr<RankServer> server;
  return server;
}

// The settings one process's server cannot serve two ways. Returns the first
// that differs, as the words between "with a" and "the one given" of the
// refusal (its Options name and variable among them), or "".
std::string conflicting_setting(const TransportConfig& running, const TransportConfig& wanted) {
  const auto different = [](const char* field) { return std::string("different ") + field + " than"; };
  if (wanted.auth_token != running.auth_token) return different("auth_token (TORCH_GRPC_PG_AUTH_TOKEN)");
  if (wanted.tls_cert_file != running.tls_cert_file) return different("tls_cert (TORCH_GRPC_PG_TLS_CERT)");
  if (wanted.tls_key_file != running.tls_key_file) return different("tls_key (TORCH_GRPC_PG_TLS_KEY)");
  if (wanted.tls_ca_file != running.tls_ca_file) return different("tls_ca (TORCH_GRPC_PG_TLS_CA)");
  if (wanted.tls_server_name != running.tls_server_name) return different("tls_server_name (TORCH_GRPC_PG_TLS_SERVER_NAME)");
  if (wanted.bind_host != running.bind_host) return different("bind_host (TORCH_GRPC_PG_BIND_HOST)");
  if (wanted.port != 0 && wanted.port != running.port) return different("port (TORCH_GRPC_PG_PORT)");
  if (wanted.unix_sockets != running.unix_sockets) return different("unix_sockets (TORCH_GRPC_PG_UNIX_SOCKETS)");
  if (wanted.health_public != running.health_public) return different("health_public (TORCH_GRPC_PG_HEALTH_PUBLIC)");
  if (wanted.encrypt != running.encrypt) return different("encrypt (TORCH_GRPC_PG_ENCRYPT)");
  if (wanted.max_payload_bytes > running.max_payload_bytes) {
    // The server bounds what it buffers per message by the first group's chunk.
    return "smaller chunk_bytes (TORCH_GRPC_PG_CHUNK_BYTES: " + std::to_string(running.max_payload_bytes) +
           " bytes) than";
  }
  return "";
}

}  // namespace

class RankServer::Service : public ServiceBase {
 public:
  explicit Service(RankServer& server) : server_(server) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(grpc::CallbackServerContext* ctx) override {
    return new ExchangeReactor(ctx, server_);  // deletes itself in OnDone
  }

 private:
  RankServer& server_;
};

std::shared_ptr<RankServer> RankServer::acquire(const TransportConfig& config) {
  std::lock_guard<std::mutex> lock(current_mutex());
  if (auto server = current_server().lock()) {
    const std::string field = conflicting_setting(server->config_, config);
    if (!field.empty()) {
      throw std::invalid_argument(
          "this process already serves its process groups with a " + field +
          " the one given for this group. Every group of a process shares one server and its "
          "security settings: leave the field unset in this group's Options to inherit it, or "
          "give it the same value.");
    }
    return server;
  }
  auto server = std::make_shared<RankServer>(config);
  current_server() = server;
  return server;
}

std::optional<TransportConfig> RankServer::running_config() {
  std::lock_guard<std::mutex> lock(current_mutex());
  if (auto server = current_server().lock()) return server->config_;
  return std::nullopt;
}

RankServer::RankServer(const TransportConfig& config) : config_(config), service_(std::make_unique<Service>(*this)) {
  if (config.tune_malloc) keep_freed_memory_for_reuse();
  grpc::ServerBuilder builder;
  apply_server_options(builder, config.max_payload_bytes + kMaxHeaderBytes + kFramingBytes);
  resize_quota();
  builder.SetResourceQuota(quota_);
  // gRPC's Health and reflection services cannot run this backend's token
  // handshake, so they are served only where nothing else guards the port
  // either (no token) or where TLS with client certificates guards it. The
  // operator may open Health, which tells only whether the rank is healthy,
  // to probes; reflection stays behind the same guard as the ranks' streams.
  const bool mutual_tls = !config.tls_ca_file.empty() && !config.tls_cert_file.empty();
  const bool open = config.auth_token.empty() && config.tls_ca_file.empty();
  grpc::EnableDefaultHealthCheckService(open || mutual_tls || config.health_public);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  if (!open && !mutual_tls) builder.SetOption(std::make_unique<WithoutReflection>());
  const auto credentials = server_credentials(config);
  std::string host = config.bind_host.empty() ? "0.0.0.0" : config.bind_host;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  builder.AddListeningPort(host + ":" + std::to_string(config.port), credentials, &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    throw std::runtime_error("could not start the gRPC server on " + host + ":" + std::to_string(config.port) +
                             ": the port is in use, or the address is not one of this host's. Choose another "
                             "port with TORCH_GRPC_PG_PORT (0 for any free port), or another address with "
                             "TORCH_GRPC_PG_BIND_HOST.");
  }
  config_.port = port_;
  if (config.unix_sockets) {
    // The unix socket carries no TLS: only this user can reach it, and what
    // TLS would add against its own processes they could read from memory.
    auto socket_dir = std::make_unique<PrivateSocketDir>();
    unix_listener_ = std::make_unique<UnixListener>(socket_dir->socket_path(), *server_);
    unix_path_ = socket_dir->socket_path();
    socket_dir_holder_ = std::move(socket_dir);
  }
  refresh_health();
}

RankServer::~RankServer() {
  unix_listener_.reset();  // no connection reaches the server while it shuts down
  // Bounded: a peer that never closes its stream must not hang process exit.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

void RankServer::register_group(const std::string& key, int rank, int world, size_t max_payload_bytes,
                                std::string settings, std::shared_ptr<Mailbox> mailbox,
                                std::shared_ptr<GroupMonitor> monitor) {
  auto group = std::make_shared<ServedGroup>(ServedGroup{rank, world, max_payload_bytes, std::move(settings),
                                                         std::move(mailbox), std::move(monitor),
                                                         std::vector<std::string>(world)});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_[{key, rank}] = std::move(group);
    resize_quota();
  }
  refresh_health();
}

void RankServer::unregister_group(const std::string& key, int rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.erase({key, rank});
    resize_quota();
  }
  refresh_health();
}

std::vector<GroupSnapshot> RankServer::snapshot() const {
  std::vector<std::shared_ptr<ServedGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, group] : groups_) groups.push_back(group);
  }
  // The connections of a striped group are registered apart but share one
  // monitor: the group is shown once.
  std::vector<GroupSnapshot> out;
  std::vector<const GroupMonitor*> shown;
  for (const auto& group : groups) {
    if (std::find(shown.begin(), shown.end(), group->monitor.get()) != shown.end()) continue;
    shown.push_back(group->monitor.get());
    out.push_back(group->monitor->snapshot());
  }
  return out;
}

void RankServer::refresh_health() {
  auto* health = server_ ? server_->GetHealthCheckService() : nullptr;
  if (health == nullptr) return;
  bool serving = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, group] : groups_) serving = serving && !group->mailbox->failed();
  }
  health->SetServingStatus(serving);
}

void RankServer::resize_quota() {
  // gRPC buffers a whole message before it checks its size against the
  // receive limit, so a stranger could announce a huge one. The quota caps
  // what the server's connections may hold at once: what the groups' peers
  // legitimately keep in flight (a full mailbox queue and a full HTTP/2
  // window per peer, twice over for slack) plus a reserve for handshakes.
  size_t bytes = kQuotaReserveBytes;
  for (const auto& [key, group] : groups_) {
    const size_t per_peer = config_.max_queued_frames * (group->max_payload_bytes + kMaxHeaderBytes) +
                            kStreamWindowBytes;
    bytes += 2 * per_peer * static_cast<size_t>(group->world - 1);
  }
  quota_.Resize(bytes);
}

std::shared_ptr<ServedGroup> RankServer::find_group(const std::string& key, int src, int dst, int world,
                                                    const std::string& settings, std::string* error) const {
  std::shared_ptr<ServedGroup> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find({key, dst});
    // Not here as `dst`: another rank of the group may be, which tells of stale addresses.
    if (it == groups_.end()) it = groups_.lower_bound({key, std::numeric_limits<int>::min()});
    if (it != groups_.end() && it->first.first == key) group = it->second;
  }
  if (!group) {
    *error = "no process group '" + key + "' on this rank (it was destroyed, or never created here)";
    return nullptr;
  }
  if (dst != group->rank || world != group->world) {
    *error = "rank " + std::to_string(src) + " expected rank " + std::to_string(dst) + " of " +
             std::to_string(world) + " at this address, but it is rank " + std::to_string(group->rank) + " of " +
             std::to_string(group->world) + "; the store holds stale addresses";
    return nullptr;
  }
  if (src < 0 || src >= group->world || src == group->rank) {
    *error = "rank " + std::to_string(src) + " is not a peer in a group of " + std::to_string(group->world);
    return nullptr;
  }
  if (settings != group->settings) {
    *error = "rank " + std::to_string(src) + " runs this group with " + settings + ", rank " +
             std::to_string(group->rank) + " with " + group->settings +
             ". Set TORCH_GRPC_PG_CHUNK_BYTES, TORCH_GRPC_PG_DIRECT_MAX_BYTES, TORCH_GRPC_PG_WIRE_DTYPE, "
             "TORCH_GRPC_PG_TWO_LEVEL and TORCH_GRPC_PG_CONNECTIONS_PER_PEER (or the Options fields) to the same "
             "values on every rank, and the TLS settings (TORCH_GRPC_PG_TLS_*) on all ranks or none.";
    return nullptr;
  }
  return group;
}

bool RankServer::attach(ServedGroup& group, int src, const std::string& peer, std::string* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string& holder = group.attached.at(src);
  if (!holder.empty()) {
    *error = "rank " + std::to_string(src) + " already has a stream to rank " + std::to_string(group.rank) +
             " (from " + holder + "); a process group has exactly one per pair of ranks, for its whole life";
    return false;
  }
  holder = peer.empty() ? "?" : peer;
  return true;
}

}  // namespace tgpg
