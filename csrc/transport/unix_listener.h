#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <string>
#include <thread>

namespace tgpg {

// The rank's unix socket. gRPC could listen on it too, but then no call could
// learn which process is at its other end, which a shared ring's offer must be
// checked against (see ReceiveRing::attach). So the rank accepts connections
// here, on a thread of its own, refuses those of other users, and hands each to
// the gRPC server, whose calls then name the connection's descriptor
// (identify_call_peer).
class UnixListener {
 public:
  // Binds and listens at `path` (mode 0600), then accepts until destroyed.
  // `server` must be started and outlive the listener.
  UnixListener(const std::string& path, grpc::Server& server);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

 private:
  void run();

  grpc::Server& server_;
  int fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tgpg
