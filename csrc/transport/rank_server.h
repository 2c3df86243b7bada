#pragma once

#include <grpcpp/server.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "transport/mailbox.h"
#include "transport/transport_config.h"

namespace tgpg {

// The one gRPC server of this process: every process group on this rank shares
// its port (and its unix socket). Incoming streams are routed to the group's
// mailbox by the group key they present.
class RankServer {
 public:
  // Starts the server on first use; later callers share it, and the settings
  // of the first caller apply. It stops when the last holder lets go.
  static std::shared_ptr<RankServer> acquire(const TransportConfig& config);

  RankServer(const TransportConfig& config, std::string unix_path);
  ~RankServer();
  RankServer(const RankServer&) = delete;
  RankServer& operator=(const RankServer&) = delete;

  int port() const { return port_; }
  // Empty when unix sockets are off.
  const std::string& unix_path() const { return unix_path_; }

  void register_group(const std::string& key, int rank, int world, std::shared_ptr<Mailbox> mailbox);
  void unregister_group(const std::string& key);

  struct Group {
    int rank;
    int world;
    std::shared_ptr<Mailbox> mailbox;
  };
  // Checks a peer's credentials and claims; returns the group or sets `error`.
  std::shared_ptr<const Group> admit(const std::string& key, const std::string& token, int src,
                                     std::string* error) const;
  const std::string& auth_token() const { return auth_token_; }

  class Service;

 private:
  std::string auth_token_;
  std::string unix_path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const Group>> groups_;
};

}  // namespace tgpg
