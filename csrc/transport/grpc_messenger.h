#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/endpoint.h"
#include "transport/group_transport.h"
#include "transport/mailbox.h"
#include "transport/peer_link.h"
#include "transport/rank_server.h"
#include "transport/transport_config.h"

namespace tgpg {

// The Messenger of one process group on this rank, over gRPC. Receives through
// the process's shared RankServer; sends on one PeerLink per peer, opened by
// connect() when the group is created (or else at the first send).
class GrpcMessenger : public GroupTransport {
 public:
  // `monitor`: one to share with other transports of the same group (the
  // connections of a StripedTransport); null: the messenger makes its own.
  GrpcMessenger(const TransportConfig& config, std::string group_key, int rank, int world,
                std::shared_ptr<GroupMonitor> monitor = nullptr);
  ~GrpcMessenger() override;

  const std::string& group_key() const override { return group_key_; }
  GroupMonitor& monitor() override { return *monitor_; }
  void expect(int src, const FrameHeader& expected) override;
  std::string local_endpoint() const override { return self_.serialize(); }
  void set_peer_endpoints(const std::vector<std::string>& endpoints) override;
  std::vector<std::string> host_ids() const override;
  void connect(int peer) override;
  std::optional<uint32_t> peer_pid(int peer) override;

  void send(int dst, const FrameHeader& header, ByteView payload,
            const std::shared_ptr<SendTracker>& tracker) override;
  ReceivedFrame recv(int src, Deadline deadline) override;
  void abort_peers(const std::string& reason) override;

  void fail(const std::string& reason) override;
  bool failed() const override { return mailbox_->failed(); }
  std::string failure() const override { return mailbox_->failure(); }
  void add_failure_listener(std::function<void(const std::string&)> listener) override;
  int wait_any_source(Deadline deadline) override { return mailbox_->wait_any(deadline); }
  bool has_frame(int src) const override { return mailbox_->has_frame(src); }
  void shut_down() override;

 private:
  // Shared, so that a send still writing on a link keeps it alive while
  // shut_down closes it: the write then fails instead of touching freed memory.
  std::shared_ptr<PeerLink> link(int peer);
  std::shared_ptr<PeerLink> find_link(int peer);
  void write_flight_record() const;
  // A failed group's ops must not wait for payloads that will never reach a
  // peer: the first failure abandons the trackers of ops that sent through
  // this messenger, and any tracker that sends later.
  void watch(const std::shared_ptr<SendTracker>& tracker);
  void abandon_trackers(const std::string& reason);

  // How long closing the links may take in all, before streams are cut.
  static constexpr std::chrono::milliseconds kCloseTimeout{1000};

  TransportConfig config_;
  std::string group_key_;
  int rank_;
  int world_;
  std::shared_ptr<RankServer> server_;
  std::shared_ptr<Mailbox> mailbox_;
  std::shared_ptr<GroupMonitor> monitor_;
  Endpoint self_;
  std::vector<Endpoint> peers_;
  std::mutex links_mutex_;
  std::vector<std::shared_ptr<PeerLink>> links_;
  bool shut_down_ = false;
  std::mutex trackers_mutex_;
  std::vector<std::weak_ptr<SendTracker>> trackers_;  // live ones: see watch()
  std::string abandon_reason_;                         // set by the first failure
  mutable std::mutex record_mutex_;  // one flight record written at a time
  std::mutex listeners_mutex_;
  std::vector<std::function<void(const std::string&)>> failure_listeners_;
};

}  // namespace tgpg
