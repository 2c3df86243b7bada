// A PeerLink's stream ending under the threads that write to it. The group's
// threads write from outside gRPC's reactions, so the call may finish between
// a writer's check that the stream is open and its StartWrite; the stream's
// hold is what keeps the call's state alive for that write. Without it this
// test crashed or corrupted the heap within a few hundred rounds. Each round
// also checks that the server's reason for ending the call reaches the link's
// owner, once, while the link is still open.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/endpoint.h"
#include "transport/group_transport.h"
#include "transport/peer_link.h"

namespace tgpg {
namespace {

TransportConfig loopback_config() {
  TransportConfig config;
  config.bind_host = "127.0.0.1";
  config.advertise_host = "127.0.0.1";
  config.shared_memory = false;   // small frames only: every one goes on the stream
  config.max_queued_frames = 1024;  // the server keeps reading until the bad frame
  config.max_payload_bytes = 4096;
  config.connect_timeout = std::chrono::seconds(10);
  return config;
}

// What a link reports through its on_failure callback.
class FailureReports {
 public:
  std::function<void(const std::string&)> callback() {
    return [this](const std::string& reason) {
      std::lock_guard<std::mutex> lock(mutex_);
      reasons_.push_back(reason);
      cv_.notify_all();
    };
  }
  // The reports once one has come, or none after `at_most`.
  std::vector<std::string> wait_for_one(std::chrono::seconds at_most) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, at_most, [&] { return !reasons_.empty(); });
    return reasons_;
  }
  std::vector<std::string> all() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reasons_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> reasons_;
};

FrameHeader data_header(uint64_t seq) {
  FrameHeader header;
  header.seq = seq;
  return header;
}

TEST(PeerLink, StreamEndsWhileOtherThreadsWrite) {
  const TransportConfig config = loopback_config();
  const std::vector<std::byte> oversized(config.max_payload_bytes + 1);
  // The process's server lives while a group does; this one keeps it up
  // between rounds, as a training process's server stays up.
  std::unique_ptr<GroupTransport> keeps_server_up = create_group_transport(config, "peer-link-test", 0, 1);
  constexpr int kRounds = 2000;
  for (int round = 0; round < kRounds; ++round) {
    // Rank 1 is served by this process's server; rank 0 is only a link to it.
    const std::string key = "peer-link-test-" + std::to_string(round);
    std::unique_ptr<GroupTransport> server_side = create_group_transport(config, key, 1, 2);
    const Endpoint self = Endpoint::parse(server_side->local_endpoint());
    FailureReports failures;
    auto link = std::make_unique<PeerLink>(dial_target(self, self, config.unix_sockets), LinkIdentity{key, 0, 1, 2},
                                           config, failures.callback(), [](size_t, bool) {});

    std::atomic<bool> started{false};
    std::thread writer([&] {
      for (uint64_t seq = 0; seq < 200; ++seq) {
        started = true;
        if (!link->send(data_header(seq), ByteView{}, nullptr)) break;
      }
    });
    while (!started) std::this_thread::yield();
    // A payload over the group's bound: the server ends the call at once.
    link->send(data_header(0), ByteView{oversized.data(), oversized.size()}, nullptr);
    writer.join();
    const std::vector<std::string> reported = failures.wait_for_one(std::chrono::seconds(30));
    ASSERT_EQ(reported.size(), 1u) << "round " << round << ": the link did not report the end of its call";
    EXPECT_NE(reported[0].find("sent an unreadable frame"), std::string::npos)
        << "round " << round << ": the server's reason did not reach the link: " << reported[0];
    link.reset();  // closes the stream and waits for its end
    ASSERT_EQ(failures.all().size(), 1u) << "round " << round << ": the link reported its end twice";
    server_side->shut_down();
  }
}

}  // namespace
}  // namespace tgpg
