#include "transport/grpc_messenger.h"

#include <stdexcept>

#include "algorithms/collective_error.h"
#include "transport/wire_format.h"

namespace tgpg {

GrpcMessenger::GrpcMessenger(const TransportConfig& config, std::string group_key, int rank, int world)
    : config_(config),
      group_key_(std::move(group_key)),
      rank_(rank),
      world_(world),
      server_(RankServer::acquire(config)),
      mailbox_(std::make_shared<Mailbox>(rank, world, config.max_queued_frames)),
      links_(world) {
  const std::string host = config.advertise_host.empty() ? default_advertise_host() : config.advertise_host;
  const bool ipv6 = host.find(':') != std::string::npos;
  self_.machine = local_machine_id();
  self_.tcp = (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(server_->port());
  self_.unix_path = server_->unix_path();
  server_->register_group(group_key_, rank_, world_, mailbox_);
}

GrpcMessenger::~GrpcMessenger() { shut_down(); }

void GrpcMessenger::set_peer_endpoints(const std::vector<std::string>& endpoints) {
  peers_.clear();
  for (const auto& text : endpoints) peers_.push_back(Endpoint::parse(text));
}

PeerLink& GrpcMessenger::link(int peer) {
  std::lock_guard<std::mutex> lock(links_mutex_);
  if (shut_down_) throw CollectiveError("the process group was destroyed");
  auto& slot = links_.at(peer);
  if (!slot) {
    const std::string target = dial_target(self_, peers_.at(peer), config_.unix_sockets);
    auto mailbox = mailbox_;
    slot = std::make_unique<PeerLink>(target, LinkIdentity{group_key_, rank_, peer, world_}, config_,
                                      [mailbox](const std::string& reason) { mailbox->fail(reason); });
  }
  return *slot;
}

void GrpcMessenger::connect(int peer) {
  try {
    link(peer);
  } catch (const std::runtime_error& e) {
    throw CollectiveError(e.what());
  }
}

void GrpcMessenger::send(int dst, const FrameHeader& header, ByteView payload,
                         const std::shared_ptr<SendTracker>& tracker) {
  PeerLink* target;
  try {
    target = &link(dst);
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw CollectiveError(e.what());
  }
  std::function<void()> release;
  if (payload.size > 0) {
    tracker->acquire();
    release = [tracker] { tracker->release(); };
  }
  if (!target->write(encode_frame(header, payload, std::move(release)))) {
    throw CollectiveError("the connection to rank " + std::to_string(dst) + " is closed" +
                          (failed() ? ": " + failure() : std::string()));
  }
}

ReceivedFrame GrpcMessenger::recv(int src, Deadline deadline) { return mailbox_->take(src, deadline); }

void GrpcMessenger::abort_peers(const std::string& reason) {
  FrameHeader header;
  header.kind = FrameKind::Abort;
  header.src_rank = static_cast<uint32_t>(rank_);
  header.error = reason;
  // Only over streams already open: dialling a dead peer could take the whole
  // connect timeout, and a peer without a stream from us learns of the failure
  // from another peer's abort or from its own timeout.
  std::lock_guard<std::mutex> lock(links_mutex_);
  for (auto& link : links_) {
    if (link) link->write(encode_frame(header, ByteView{}, nullptr));
  }
}

void GrpcMessenger::shut_down() {
  std::vector<std::unique_ptr<PeerLink>> links;
  {
    std::lock_guard<std::mutex> lock(links_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    links.swap(links_);
  }
  server_->unregister_group(group_key_);
  mailbox_->shut_down();
  links.clear();  // each PeerLink closes its stream, within a bound
}

}  // namespace tgpg

namespace tgpg {

std::unique_ptr<GroupTransport> create_group_transport(const TransportConfig& config,
                                                       const std::string& group_key, int rank, int world) {
  return std::make_unique<GrpcMessenger>(config, group_key, rank, world);
}

}  // namespace tgpg
