#include "memory_messenger.h"

#include <stdexcept>

#include "algorithms/collective_error.h"

namespace tgpg_test {
namespace {

// Releases one zero-copy payload when the last holder of the received frame
// lets go of it.
class PayloadHold {
 public:
  PayloadHold(std::shared_ptr<tgpg::SendTracker> tracker, int dst) : tracker_(std::move(tracker)), dst_(dst) {
    if (tracker_) tracker_->acquire(dst_);
  }
  ~PayloadHold() {
    if (tracker_) tracker_->release(dst_);
  }
  PayloadHold(const PayloadHold&) = delete;
  PayloadHold& operator=(const PayloadHold&) = delete;

 private:
  std::shared_ptr<tgpg::SendTracker> tracker_;
  int dst_;
};

}  // namespace

class MemoryNetwork::RankMessenger : public tgpg::Messenger {
 public:
  RankMessenger(MemoryNetwork& network, int rank) : network_(network), rank_(rank) {}

  void send(int dst, const tgpg::FrameHeader& header, tgpg::ByteView payload,
            const std::shared_ptr<tgpg::SendTracker>& tracker) override {
    // An algorithm that sends to itself or outside the group is broken; say so
    // loudly rather than queueing a frame nobody will read.
    if (dst < 0 || dst >= network_.world() || dst == rank_) {
      throw std::logic_error("rank " + std::to_string(rank_) + " sent a frame to rank " +
                             std::to_string(dst));
    }
    tgpg::ReceivedFrame frame;
    frame.header = header;
    const std::byte* data = payload.data;
    if (network_.options_.zero_copy) {
      // As in the real transport, an empty payload holds no memory and is
      // released at once.
      frame.owner = std::make_shared<PayloadHold>(payload.size > 0 ? tracker : nullptr, dst);
    } else {
      auto copy = std::make_shared<std::vector<std::byte>>(payload.data, payload.data + payload.size);
      data = copy->data();
      frame.owner = std::move(copy);
    }
    frame.payload = cut(data, payload.size);
    network_.push(rank_, dst, std::move(frame));
  }

  tgpg::ReceivedFrame recv(int src, tgpg::Deadline deadline) override {
    if (src < 0 || src >= network_.world() || src == rank_) {
      throw std::logic_error("rank " + std::to_string(rank_) + " waited for a frame from rank " +
                             std::to_string(src));
    }
    return network_.pop(src, rank_, deadline);
  }

  void abort_peers(const std::string& reason) override {
    for (int peer = 0; peer < network_.world(); ++peer) {
      if (peer == rank_) continue;
      tgpg::ReceivedFrame frame;
      frame.header.kind = tgpg::FrameKind::Abort;
      frame.header.src_rank = static_cast<uint32_t>(rank_);
      frame.header.error = reason;
      network_.push(rank_, peer, std::move(frame));
    }
  }

 private:
  // The views a payload arrives as. An empty payload arrives as no view at
  // all, as it does from the wire.
  std::vector<tgpg::ByteView> cut(const std::byte* data, size_t size) {
    std::vector<tgpg::ByteView> views;
    if (size == 0) return views;
    if (!network_.options_.split_payloads) {
      views.push_back({data, size});
      return views;
    }
    for (size_t at = 0; at < size;) {
      // Piece sizes of 1..7 bytes cut elements of 2, 4 and 8 bytes at every offset.
      state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
      const size_t piece = std::min<size_t>(size - at, 1 + (state_ >> 33) % 7);
      views.push_back({data + at, piece});
      at += piece;
    }
    return views;
  }

  MemoryNetwork& network_;
  const int rank_;
  uint64_t state_ = 0x9e3779b97f4a7c15ULL;
};

MemoryNetwork::MemoryNetwork(int world, MemoryOptions options) : world_(world), options_(options) {
  for (int i = 0; i < world * world; ++i) queues_.push_back(std::make_unique<Queue>());
  for (int rank = 0; rank < world; ++rank) {
    messengers_.push_back(std::make_unique<RankMessenger>(*this, rank));
  }
}

MemoryNetwork::~MemoryNetwork() = default;

tgpg::Messenger& MemoryNetwork::messenger(int rank) { return *messengers_.at(rank); }

size_t MemoryNetwork::frames_in_flight() const {
  size_t total = 0;
  for (const auto& q : queues_) {
    std::lock_guard<std::mutex> lock(q->mutex);
    total += q->frames.size();
  }
  return total;
}

MemoryNetwork::Queue& MemoryNetwork::queue(int src, int dst) { return *queues_.at(src * world_ + dst); }

void MemoryNetwork::push(int src, int dst, tgpg::ReceivedFrame frame) {
  Queue& q = queue(src, dst);
  std::lock_guard<std::mutex> lock(q.mutex);
  q.frames.push_back(std::move(frame));
  q.arrived.notify_all();
}

tgpg::ReceivedFrame MemoryNetwork::pop(int src, int dst, tgpg::Deadline deadline) {
  Queue& q = queue(src, dst);
  std::unique_lock<std::mutex> lock(q.mutex);
  if (!q.arrived.wait_until(lock, deadline, [&] { return !q.frames.empty(); })) {
    throw tgpg::PeerTimeout("no frame from rank " + std::to_string(src) + " before the deadline");
  }
  tgpg::ReceivedFrame frame = std::move(q.frames.front());
  q.frames.pop_front();
  return frame;
}

}  // namespace tgpg_test
