#include "transport/striped_transport.h"

#include <stdexcept>

#include "transport/endpoint.h"
#include "transport/grpc_messenger.h"
#include "transport/run_together.h"

namespace tgpg {

StripedTransport::StripedTransport(const TransportConfig& config, const std::string& group_key, int rank,
                                   int world)
    : striped_(world, false), sent_(world), received_(world) {
  if (config.connections_per_peer < 2) {
    throw std::invalid_argument("a striped transport needs connections_per_peer of at least 2");
  }
  unix_sockets_ = config.unix_sockets;
  TransportConfig one = config;
  one.connections_per_peer = 1;
  auto monitor = std::make_shared<GroupMonitor>(group_key, rank, world, config.flight_recorder_size);
  connections_.push_back(std::make_unique<GrpcMessenger>(one, group_key, rank, world, monitor));
  // The group's own connection writes the flight record; the others would
  // write the same record under other names.
  one.flight_recorder_dir.clear();
  for (int k = 1; k < config.connections_per_peer; ++k) {
    connections_.push_back(
        std::make_unique<GrpcMessenger>(one, group_key + "/c" + std::to_string(k), rank, world, monitor));
  }
  // The connections fail as one: whichever fails first fails the others,
  // and each tells its peers over its own links.
  for (auto& from : connections_) {
    from->add_failure_listener([this](const std::string& reason) {
      for (auto& to : connections_) to->fail(reason);
    });
  }
}

StripedTransport::~StripedTransport() { shut_down(); }

void StripedTransport::set_peer_endpoints(const std::vector<std::string>& endpoints) {
  for (auto& connection : connections_) connection->set_peer_endpoints(endpoints);
  const Endpoint self = Endpoint::parse(local_endpoint());
  for (size_t peer = 0; peer < endpoints.size() && peer < striped_.size(); ++peer) {
    striped_[peer] = !is_unix_address(dial_target(self, Endpoint::parse(endpoints[peer]), unix_sockets_));
  }
}

void StripedTransport::connect(int peer) {
  if (!striped_.at(peer)) return first().connect(peer);
  std::vector<std::function<void()>> connects;
  for (auto& connection : connections_) connects.emplace_back([&connection, peer] { connection->connect(peer); });
  run_together(std::move(connects));
}

GroupTransport& StripedTransport::connection(int peer, const Turn& turn) const {
  if (!striped_.at(peer)) return first();
  return *connections_[turn.next % connections_.size()];
}

void StripedTransport::send(int dst, const FrameHeader& header, ByteView payload,
                            const std::shared_ptr<SendTracker>& tracker) {
  // Under the turn's lock, so that two threads sending to one peer queue
  // their frames on the connections in the order they took their turns.
  Turn& turn = sent_.at(dst);
  std::lock_guard<std::mutex> lock(turn.mutex);
  connection(dst, turn).send(dst, header, payload, tracker);
  ++turn.next;
}

void StripedTransport::expect(int src, const FrameHeader& expected) {
  const Turn& turn = received_.at(src);
  std::lock_guard<std::mutex> lock(turn.mutex);
  connection(src, turn).expect(src, expected);
}

ReceivedFrame StripedTransport::recv(int src, Deadline deadline) {
  Turn& turn = received_.at(src);
  std::lock_guard<std::mutex> lock(turn.mutex);
  // A receive that throws took nothing: the frame is still due on the same
  // connection.
  ReceivedFrame frame = connection(src, turn).recv(src, deadline);
  ++turn.next;
  return frame;
}

bool StripedTransport::has_frame(int src) const {
  const Turn& turn = received_.at(src);
  std::lock_guard<std::mutex> lock(turn.mutex);
  return connection(src, turn).has_frame(src);
}

int StripedTransport::wait_any_source(Deadline) {
  throw std::logic_error(
      "receives from any source run on the group's point-to-point transport, which has one connection per peer");
}

void StripedTransport::abort_peers(const std::string& reason) {
  for (auto& connection : connections_) connection->abort_peers(reason);
}

void StripedTransport::fail(const std::string& reason) {
  for (auto& connection : connections_) connection->fail(reason);
}

bool StripedTransport::failed() const {
  for (const auto& connection : connections_) {
    if (connection->failed()) return true;
  }
  return false;
}

std::string StripedTransport::failure() const {
  for (const auto& connection : connections_) {
    if (connection->failed()) return connection->failure();
  }
  return {};
}

void StripedTransport::add_failure_listener(std::function<void(const std::string&)> listener) {
  // Every connection fails when the first does (see the constructor), so the
  // group's own connection tells the listener once.
  first().add_failure_listener(std::move(listener));
}

void StripedTransport::shut_down() {
  for (auto& connection : connections_) connection->shut_down();
}

}  // namespace tgpg
