#pragma once

#include <grpcpp/resource_quota.h>
#include <grpcpp/server.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/group_monitor.h"
#include "transport/mailbox.h"
#include "transport/socket_dir.h"
#include "transport/transport_config.h"
#include "transport/unix_listener.h"

namespace tgpg {

// A process group as the server sees it: where its frames go, and which
// peers hold its one authenticated stream per source rank.
struct ServedGroup {
  int rank;
  int world;
  size_t max_payload_bytes;
  std::string settings;
  std::shared_ptr<Mailbox> mailbox;
  std::shared_ptr<GroupMonitor> monitor;
  // Per source rank: the peer address of the stream that authenticated as it,
  // or "". A rank opens one stream per group to each peer, for the group's
  // life; once taken, a place stays taken after that stream ends, so that no
  // stranger can take it over for the rest of the group's life.
  std::vector<std::string> attached;
};

// The one gRPC server of this process: every process group on this rank shares
// its port (and its unix socket). An incoming Exchange stream authenticates
// (see ExchangeReactor) and is then bound to one (group, source rank).
class RankServer {
 public:
  // Starts the server on first use; later callers share it. A caller whose
  // security or listening settings differ from the running server's gets a
  // std::invalid_argument naming the field. It stops when the last holder lets go.
  static std::shared_ptr<RankServer> acquire(const TransportConfig& config);
  // The settings of the running server, if one runs.
  static std::optional<TransportConfig> running_config();

  explicit RankServer(const TransportConfig& config);
  ~RankServer();
  RankServer(const RankServer&) = delete;
  RankServer& operator=(const RankServer&) = delete;

  int port() const { return port_; }
  // Empty when unix sockets are off.
  const std::string& unix_path() const { return unix_path_; }
  const TransportConfig& config() const { return config_; }

  void register_group(const std::string& key, int rank, int world, size_t max_payload_bytes, std::string settings,
                      std::shared_ptr<Mailbox> mailbox, std::shared_ptr<GroupMonitor> monitor);
  void unregister_group(const std::string& key, int rank);

  // Every group's state, for an authenticated observer.
  std::vector<GroupSnapshot> snapshot() const;
  // The gRPC health status: SERVING while no group of this process has failed.
  void refresh_health();

  // The group a Hello names, if it exists here and the claims fit it; else sets `error`.
  std::shared_ptr<ServedGroup> find_group(const std::string& key, int src, int dst, int world,
                                          const std::string& settings, std::string* error) const;
  // Binds an authenticated stream to (group, src), once for the group's life:
  // a second stream is refused, with `error` saying from where the first came,
  // whether or not the first has ended since.
  bool attach(ServedGroup& group, int src, const std::string& peer, std::string* error);

  class Service;

 private:
  void resize_quota();  // mutex_ held, or in the constructor

  static constexpr size_t kQuotaReserveBytes = 128 << 20;

  TransportConfig config_;
  grpc::ResourceQuota quota_{"torch_grpc_pg"};
  std::unique_ptr<PrivateSocketDir> socket_dir_holder_;
  std::string unix_path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixListener> unix_listener_;  // after server_: it hands connections to it
  int port_ = 0;
  mutable std::mutex mutex_;
  // By group key and rank: one process may hold several ranks of a group (torchft's
  // tests run each replica as a thread), each with its own mailbox behind this server.
  std::map<std::pair<std::string, int>, std::shared_ptr<ServedGroup>> groups_;
};

}  // namespace tgpg
