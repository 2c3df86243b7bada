#include "transport/rank_server.h"

#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "torch_grpc_pg.grpc.pb.h"
#include "transport/channel_options.h"
#include "transport/exchange_reactor.h"
#include "transport/protocol.h"

namespace tgpg {
namespace {

using ServiceBase = torch_grpc_pg::ProcessGroupService::WithRawCallbackMethod_Exchange<
    torch_grpc_pg::ProcessGroupService::WithCallbackMethod_Handshake<
        torch_grpc_pg::ProcessGroupService::Service>>;

std::string metadata(const grpc::CallbackServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

std::string unique_unix_path() {
  const char* tmp = std::getenv("TMPDIR");
  std::random_device random;
  char name[128];
  std::snprintf(name, sizeof(name), "%s/torch-grpc-pg-%d-%08x.sock", tmp && *tmp ? tmp : "/tmp",
                static_cast<int>(getpid()), random());
  return name;
}

}  // namespace

class RankServer::Service : public ServiceBase {
 public:
  explicit Service(const RankServer& server) : server_(server) {}

  grpc::ServerUnaryReactor* Handshake(grpc::CallbackServerContext* ctx,
                                      const torch_grpc_pg::HandshakeRequest* request,
                                      torch_grpc_pg::HandshakeReply* reply) override {
    std::string error;
    if (request->protocol_version() != kProtocolVersion) {
      error = "protocol version " + std::to_string(request->protocol_version()) +
              " does not match this rank's version " + std::to_string(kProtocolVersion) +
              "; install the same torch-grpc-pg release on every rank";
    } else if (auto group = server_.admit(request->group_key(), request->auth_token(),
                                          static_cast<int>(request->src_rank()), &error)) {
      if (static_cast<int>(request->dst_rank()) != group->rank ||
          static_cast<int>(request->world_size()) != group->world) {
        error = "rank " + std::to_string(request->src_rank()) + " expected rank " +
                std::to_string(request->dst_rank()) + " of " + std::to_string(request->world_size()) +
                " at this address, but it is rank " + std::to_string(group->rank) + " of " +
                std::to_string(group->world) + "; the store holds stale addresses";
      }
    }
    reply->set_ok(error.empty());
    reply->set_error(error);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* ctx) override {
    std::string error;
    const std::string src_text = metadata(ctx, kSrcRankMetadata);
    const int src = src_text.empty() ? -1 : std::atoi(src_text.c_str());
    auto group = server_.admit(metadata(ctx, kGroupKeyMetadata), metadata(ctx, kTokenMetadata), src, &error);
    if (!group) {
      return new ExchangeReactor(nullptr, src, -1,
                                 grpc::Status(grpc::StatusCode::PERMISSION_DENIED, error));
    }
    return new ExchangeReactor(group->mailbox, src, group->rank, grpc::Status::OK);
  }

 private:
  const RankServer& server_;
};

std::shared_ptr<RankServer> RankServer::acquire(const TransportConfig& config) {
  static std::mutex mutex;
  static std::weak_ptr<RankServer> current;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto server = current.lock()) return server;
  auto server = std::make_shared<RankServer>(config, config.unix_sockets ? unique_unix_path() : "");
  current = server;
  return server;
}

RankServer::RankServer(const TransportConfig& config, std::string unix_path)
    : auth_token_(config.auth_token), unix_path_(std::move(unix_path)), service_(std::make_unique<Service>(*this)) {
  grpc::ServerBuilder builder;
  apply_server_options(builder);
  const auto credentials = server_credentials(config);
  std::string host = config.bind_host;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  builder.AddListeningPort(host + ":" + std::to_string(config.port), credentials, &port_);
  if (!unix_path_.empty()) {
    ::unlink(unix_path_.c_str());
    builder.AddListeningPort("unix:" + unix_path_, credentials);
  }
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    throw std::runtime_error("could not start the gRPC server on " + host + ":" + std::to_string(config.port) +
                             (unix_path_.empty() ? "" : " and unix:" + unix_path_) +
                             ". Is the port in use? Choose another with TORCH_GRPC_PG_PORT, or 0 for "
                             "any free port.");
  }
}

RankServer::~RankServer() {
  // Bounded: a peer that never closes its stream must not hang process exit.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

void RankServer::register_group(const std::string& key, int rank, int world,
                                std::shared_ptr<Mailbox> mailbox) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_[key] = std::make_shared<const Group>(Group{rank, world, std::move(mailbox)});
}

void RankServer::unregister_group(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.erase(key);
}

std::shared_ptr<const RankServer::Group> RankServer::admit(const std::string& key, const std::string& token,
                                                          int src, std::string* error) const {
  if (token != auth_token_) {
    *error = "authentication failed: the peer's TORCH_GRPC_PG_AUTH_TOKEN differs from this rank's";
    return nullptr;
  }
  std::shared_ptr<const Group> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(key);
    if (it != groups_.end()) group = it->second;
  }
  if (!group) {
    *error = "no process group '" + key + "' on this rank (it was destroyed, or never created here)";
    return nullptr;
  }
  if (src < 0 || src >= group->world || src == group->rank) {
    *error = "rank " + std::to_string(src) + " is not a peer in a group of " + std::to_string(group->world);
    return nullptr;
  }
  return group;
}

}  // namespace tgpg
