#include "transport/grpc_messenger.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "algorithms/op_type.h"

#include "algorithms/collective_error.h"
#include "transport/log.h"
#include "transport/replace_file.h"
#include "transport/striped_transport.h"
#include "transport/wire_format.h"

namespace tgpg {
namespace {

bool authenticated(const TransportConfig& config) {
  return !config.auth_token.empty() || config.tls_enabled();
}

}  // namespace

GrpcMessenger::GrpcMessenger(const TransportConfig& config, std::string group_key, int rank, int world,
                             std::shared_ptr<GroupMonitor> monitor)
    : config_(config),
      group_key_(std::move(group_key)),
      rank_(rank),
      world_(world),
      server_(RankServer::acquire(config)),
      mailbox_(std::make_shared<Mailbox>(rank, world, config.max_queued_frames,
                                         config.max_queued_frames * config.max_payload_bytes)),
      monitor_(monitor ? std::move(monitor)
                       : std::make_shared<GroupMonitor>(group_key_, rank, world, config.flight_recorder_size)),
      links_(world) {
  const std::string host = config.advertise_host.empty() ? default_advertise_host() : config.advertise_host;
  const bool ipv6 = host.find(':') != std::string::npos;
  self_.machine = local_machine_id();
  self_.tcp = (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(server_->port());
  self_.unix_path = server_->unix_path();
  // Whatever this rank detects (a broken link, a bad frame, an abort) its
  // peers hear at once, instead of each waiting out its own timeout. The
  // mailbox runs this once, on its first failure.
  mailbox_->on_first_failure([this](const std::string& reason) {
    monitor_->set_failure(reason);
    abandon_trackers(reason);
    server_->refresh_health();
    write_flight_record();
    abort_peers(reason);
    std::vector<std::function<void(const std::string&)>> listeners;
    {
      std::lock_guard<std::mutex> lock(listeners_mutex_);
      listeners = failure_listeners_;
    }
    for (const auto& listener : listeners) listener(reason);
  });
  server_->register_group(group_key_, rank_, world_, config.max_payload_bytes, config.shared_settings(), mailbox_,
                          monitor_);
}

GrpcMessenger::~GrpcMessenger() { shut_down(); }

void GrpcMessenger::add_failure_listener(std::function<void(const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(listeners_mutex_);
  failure_listeners_.push_back(std::move(listener));
}

void GrpcMessenger::set_peer_endpoints(const std::vector<std::string>& endpoints) {
  peers_.clear();
  for (const auto& text : endpoints) peers_.push_back(Endpoint::parse(text));
  if (authenticated(config_)) return;
  for (const auto& peer : peers_) {
    if (peer.machine == self_.machine) continue;
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log_warning("rank " + std::to_string(rank_) + " talks to peers on other hosts (" + peer.tcp +
                  ") without authentication or encryption: anyone who can reach this rank's port can join "
                  "its process groups' traffic. Set TORCH_GRPC_PG_AUTH_TOKEN on every rank, and "
                  "TORCH_GRPC_PG_TLS_CERT/KEY/CA where the network is not trusted.");
    });
    return;
  }
}

std::vector<std::string> GrpcMessenger::host_ids() const {
  std::vector<std::string> ids;
  ids.reserve(peers_.size());
  for (const auto& peer : peers_) ids.push_back(peer.machine);
  return ids;
}

std::shared_ptr<PeerLink> GrpcMessenger::find_link(int peer) {
  std::lock_guard<std::mutex> lock(links_mutex_);
  if (shut_down_) throw CollectiveError("the process group was destroyed");
  return links_.at(peer);
}

std::shared_ptr<PeerLink> GrpcMessenger::link(int peer) {
  if (auto existing = find_link(peer)) return existing;
  // The handshake may retry for the whole connect timeout: not under the
  // lock, which abort_peers needs meanwhile. Only this group's worker (or
  // its constructor) opens links, so no two threads race to open one.
  const std::string target = dial_target(self_, peers_.at(peer), config_.unix_sockets);
  auto mailbox = mailbox_;
  auto monitor = monitor_;
  std::shared_ptr<PeerLink> opened;
  try {
    opened = std::make_shared<PeerLink>(
        target, LinkIdentity{group_key_, rank_, peer, world_}, config_,
        [mailbox, monitor, peer](const std::string& reason) {
          monitor->set_link(peer, "broken: " + reason);
          mailbox->fail(reason);
        },
        [monitor](size_t bytes, bool through_ring) { monitor->sent(bytes, through_ring); });
  } catch (const std::exception& e) {
    monitor_->set_link(peer, std::string("failed to connect: ") + e.what());
    throw;
  }
  monitor_->set_link(peer, "open");
  std::lock_guard<std::mutex> lock(links_mutex_);
  if (shut_down_) throw CollectiveError("the process group was destroyed");
  auto& slot = links_.at(peer);
  if (!slot) slot = std::move(opened);
  return slot;
}

void GrpcMessenger::connect(int peer) {
  try {
    link(peer);
  } catch (const std::runtime_error& e) {
    throw CollectiveError(e.what());
  }
}

std::optional<uint32_t> GrpcMessenger::peer_pid(int peer) {
  const std::shared_ptr<PeerLink> open = find_link(peer);
  return open ? open->peer_pid() : std::nullopt;
}

void GrpcMessenger::send(int dst, const FrameHeader& header, ByteView payload,
                         const std::shared_ptr<SendTracker>& tracker) {
  std::shared_ptr<PeerLink> target;
  try {
    target = link(dst);
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw CollectiveError(e.what());
  }
  std::function<void()> release;
  if (payload.size > 0) {
    watch(tracker);
    tracker->acquire(dst);
    release = [tracker, dst] { tracker->release(dst); };
  }
  const bool written = target->send(header, payload, std::move(release));
  if (!written) {
    throw CollectiveError("the connection to rank " + std::to_string(dst) + " is closed" +
                          (failed() ? ": " + failure() : std::string()));
  }
}

void GrpcMessenger::watch(const std::shared_ptr<SendTracker>& tracker) {
  std::lock_guard<std::mutex> lock(trackers_mutex_);
  if (!abandon_reason_.empty()) {
    tracker->abandon(abandon_reason_);
    return;
  }
  // An op sends many chunks with one tracker, and a few ops (point-to-point
  // lanes) send at once: the list holds each live tracker once.
  bool known = false;
  trackers_.erase(std::remove_if(trackers_.begin(), trackers_.end(),
                                 [&](const std::weak_ptr<SendTracker>& weak) {
                                   const auto live = weak.lock();
                                   known = known || live == tracker;
                                   return !live;
                                 }),
                  trackers_.end());
  if (!known) trackers_.push_back(tracker);
}

void GrpcMessenger::abandon_trackers(const std::string& reason) {
  std::lock_guard<std::mutex> lock(trackers_mutex_);
  abandon_reason_ = reason.empty() ? "unknown failure" : reason;
  for (const auto& weak : trackers_) {
    if (auto tracker = weak.lock()) tracker->abandon(abandon_reason_);
  }
  trackers_.clear();
}

void GrpcMessenger::expect(int src, const FrameHeader& expected) {
  monitor_->begin_wait(src, op_name(expected.op), expected.seq, expected.offset);
}

ReceivedFrame GrpcMessenger::recv(int src, Deadline deadline) {
  ReceivedFrame frame = mailbox_->take(src, deadline);
  monitor_->end_wait();
  monitor_->received(frame.payload_bytes());
  return frame;
}

void GrpcMessenger::write_flight_record() const {
  if (config_.flight_recorder_dir.empty()) return;
  // Nothing to show: a group's point-to-point channel that never carried a message.
  if (monitor_->snapshot().recent.empty()) return;
  std::string name = group_key_;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  const std::string path = config_.flight_recorder_dir + "/torch_grpc_pg-rank" + std::to_string(rank_) + "-" + name +
                           ".json";
  // Two threads can get here at once: the one that saw the first failure (a
  // peer's abort, on a gRPC thread) and the group's worker failing its op. Each
  // takes its snapshot under the lock, so the record written last is the newest.
  std::lock_guard<std::mutex> lock(record_mutex_);
  if (!replace_file(path, monitor_->to_json())) {
    log_warning("could not write the flight record of the failed group to " + path +
                "; check that the directory exists and is writable (TORCH_GRPC_PG_FLIGHT_RECORDER_DIR)");
  }
}

void GrpcMessenger::fail(const std::string& reason) {
  mailbox_->fail(reason);
  // The group's own failure path comes here after it has recorded the failed
  // op's outcome, which a record written when a peer's abort arrived lacks.
  write_flight_record();
}

void GrpcMessenger::abort_peers(const std::string& reason) {
  FrameHeader header;
  header.kind = FrameKind::Abort;
  header.src_rank = static_cast<uint32_t>(rank_);
  header.error = reason.substr(0, kMaxAbortTextBytes);
  // Only over streams already open: dialling a dead peer could take the whole
  // connect timeout. Links are opened to every peer at creation, so every
  // peer has one unless creation itself failed.
  std::lock_guard<std::mutex> lock(links_mutex_);
  for (auto& link : links_) {
    if (link) link->send(header, ByteView{}, nullptr);
  }
}

void GrpcMessenger::shut_down() {
  std::vector<std::shared_ptr<PeerLink>> links;
  {
    std::lock_guard<std::mutex> lock(links_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    links.swap(links_);
  }
  server_->unregister_group(group_key_, rank_);
  mailbox_->shut_down();
  // All links at once under one deadline, so that destroying a group takes
  // the same bounded time at any world size.
  const auto deadline = std::chrono::steady_clock::now() + kCloseTimeout;
  for (auto& link : links) {
    if (link) link->begin_close();
  }
  for (auto& link : links) {
    if (link) link->wait_closed(deadline);
  }
  links.clear();
}

}  // namespace tgpg

namespace tgpg {

std::optional<TransportConfig> running_server_config() { return RankServer::running_config(); }

std::unique_ptr<GroupTransport> create_group_transport(const TransportConfig& config,
                                                       const std::string& group_key, int rank, int world) {
  if (config.connections_per_peer > 1) return std::make_unique<StripedTransport>(config, group_key, rank, world);
  return std::make_unique<GrpcMessenger>(config, group_key, rank, world);
}

}  // namespace tgpg
