// A long link for the namespaces of tests/two_hosts: an Ethernet hub that holds
// every frame for a set time before it passes it on.
//
//   delay_hub ONE_WAY_DELAY_US QUEUE_LIMIT_BYTES IFACE IFACE [IFACE...]
//
// The kernel here has no netem, so the delay is made in user space: in a
// namespace of its own, between the hosts' links, this program reads every
// frame that arrives on one interface (an AF_PACKET socket) and sends it out of
// every other one ONE_WAY_DELAY_US later. The hosts see a round trip of twice
// that, in TCP's handshake, its acknowledgements and HTTP/2's window updates
// alike, which is what a long link does to them. The rate stays with tbf on each
// host's own end of its link (netns.sh shape); frames queued here beyond
// QUEUE_LIMIT_BYTES for one interface are dropped, as a router's full buffer
// drops them.
//
// Frames are read and written with a virtio-net header (PACKET_VNET_HDR), so a
// segmentation-offloaded TCP frame of up to 64 KiB passes whole, with its
// checksum still to be filled in, and one system call moves 64 KiB rather than
// one MTU. It runs until SIGTERM or SIGINT and prints, on the way out, what it
// moved and dropped.
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// struct virtio_net_hdr (linux/virtio_net.h, which does not compile as C++): the
// frame's offload state, passed on unread.
constexpr size_t kVnetHeaderBytes = 10;
// A frame with its virtio-net header; GSO frames reach 64 KiB, and a read that
// does not fit is counted and dropped rather than passed on cut.
constexpr size_t kMaxFrameBytes = 256 << 10;
// Frames read from one interface before the others get a turn.
constexpr int kReadsPerTurn = 64;
// Socket buffers that absorb a burst at link rate while the loop is elsewhere.
constexpr int kSocketBufferBytes = 32 << 20;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Frame {
  Clock::time_point due;
  std::shared_ptr<const std::vector<char>> bytes;  // shared by every port it goes out of
};

struct Port {
  std::string name;
  FileDescriptor socket;
  std::deque<Frame> queue;
  size_t queued_bytes = 0;
  uint64_t frames_out = 0, bytes_out = 0, dropped = 0;
};

FileDescriptor open_port(const std::string& iface) {
  FileDescriptor s(socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL)));
  if (s.get() < 0) fail("socket(AF_PACKET)");
  const int on = 1;
  if (setsockopt(s.get(), SOL_PACKET, PACKET_VNET_HDR, &on, sizeof on) != 0) fail("PACKET_VNET_HDR");
  // What this program sends out of an interface is not read back from it.
  // PACKET_IGNORE_OUTGOING came with Linux 4.20; older kernels show such frames
  // as PACKET_OUTGOING, which the read loop skips too.
#ifdef PACKET_IGNORE_OUTGOING
  setsockopt(s.get(), SOL_PACKET, PACKET_IGNORE_OUTGOING, &on, sizeof on);
#endif
  const int buffer = kSocketBufferBytes;
  if (setsockopt(s.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0) {
    setsockopt(s.get(), SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  }
  if (setsockopt(s.get(), SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0) {
    setsockopt(s.get(), SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  }
  sockaddr_ll address{};
  address.sll_family = AF_PACKET;
  address.sll_protocol = htons(ETH_P_ALL);
  address.sll_ifindex = static_cast<int>(if_nametoindex(iface.c_str()));
  if (address.sll_ifindex == 0) fail("interface " + iface);
  if (bind(s.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) fail("bind " + iface);
  return s;
}

class Hub {
 public:
  Hub(std::chrono::microseconds delay, size_t queue_limit, const std::vector<std::string>& ifaces)
      : delay_(delay), queue_limit_(queue_limit), buffer_(kMaxFrameBytes) {
    for (const auto& iface : ifaces) ports_.push_back(Port{iface, open_port(iface)});
  }

  void run() {
    std::vector<pollfd> fds;
    for (const auto& port : ports_) fds.push_back(pollfd{port.socket.get(), POLLIN, 0});
    while (!g_stop) {
      timespec wait = until_next_due();
      if (ppoll(fds.data(), fds.size(), &wait, nullptr) < 0 && errno != EINTR) fail("ppoll");
      for (size_t i = 0; i < ports_.size(); ++i) {
        if (fds[i].revents & POLLIN) read_from(i);
      }
      send_due();
    }
  }

  void report() const {
    for (const auto& port : ports_) {
      std::fprintf(stderr, "delay_hub: out of %s: %llu frames, %llu bytes; %llu dropped\n", port.name.c_str(),
                   static_cast<unsigned long long>(port.frames_out), static_cast<unsigned long long>(port.bytes_out),
                   static_cast<unsigned long long>(port.dropped));
    }
    std::fprintf(stderr, "delay_hub: %llu frames too large to read\n", static_cast<unsigned long long>(cut_));
  }

 private:
  // Until the earliest queued frame is due; at most 100 ms, so that a signal is seen.
  timespec until_next_due() const {
    auto wait = std::chrono::nanoseconds(std::chrono::milliseconds(100));
    const auto now = Clock::now();
    for (const auto& port : ports_) {
      if (!port.queue.empty()) wait = std::min(wait, std::max(port.queue.front().due - now, Clock::duration(0)));
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  }

  void read_from(size_t from) {
    for (int n = 0; n < kReadsPerTurn; ++n) {
      sockaddr_ll source{};
      socklen_t source_len = sizeof source;
      const ssize_t got = recvfrom(ports_[from].socket.get(), buffer_.data(), buffer_.size(), MSG_TRUNC,
                                   reinterpret_cast<sockaddr*>(&source), &source_len);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        fail("recvfrom " + ports_[from].name);
      }
      if (source.sll_pkttype == PACKET_OUTGOING) continue;
      if (static_cast<size_t>(got) > buffer_.size()) {
        ++cut_;
        continue;
      }
      if (static_cast<size_t>(got) <= kVnetHeaderBytes) continue;
      auto bytes = std::make_shared<const std::vector<char>>(buffer_.begin(), buffer_.begin() + got);
      const auto due = Clock::now() + delay_;
      for (size_t to = 0; to < ports_.size(); ++to) {
        if (to == from) continue;
        Port& port = ports_[to];
        if (port.queued_bytes + bytes->size() > queue_limit_) {
          ++port.dropped;
          continue;
        }
        port.queued_bytes += bytes->size();
        port.queue.push_back(Frame{due, bytes});
      }
    }
  }

  void send_due() {
    const auto now = Clock::now();
    for (auto& port : ports_) {
      while (!port.queue.empty() && port.queue.front().due <= now) {
        const Frame& frame = port.queue.front();
        // veth transmits at once; a refusal (no buffer) loses the frame, as a
        // wire would, and TCP sends it again.
        if (send(port.socket.get(), frame.bytes->data(), frame.bytes->size(), MSG_DONTWAIT) >= 0) {
          ++port.frames_out;
          port.bytes_out += frame.bytes->size() - kVnetHeaderBytes;
        } else {
          ++port.dropped;
        }
        port.queued_bytes -= frame.bytes->size();
        port.queue.pop_front();
      }
    }
  }

  std::chrono::microseconds delay_;
  size_t queue_limit_;
  std::vector<char> buffer_;
  std::vector<Port> ports_;
  uint64_t cut_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s ONE_WAY_DELAY_US QUEUE_LIMIT_BYTES IFACE IFACE [IFACE...]\n", argv[0]);
    return 2;
  }
  try {
    const auto delay = std::chrono::microseconds(std::stoll(argv[1]));
    const auto limit = static_cast<size_t>(std::stoull(argv[2]));
    Hub hub(delay, limit, std::vector<std::string>(argv + 3, argv + argc));
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    std::fprintf(stderr, "delay_hub: ready\n");
    hub.run();
    hub.report();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "delay_hub: %s\n", e.what());
    return 1;
  }
  return 0;
}
