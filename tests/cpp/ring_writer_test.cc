// RingWriter with RingReader: a link's frames keep their order whether they go
// on the stream, in a record, or in a record naming a slot; the switch to the
// records comes first; a payload waits for a slot rather than going on the
// stream when the receiver holds every slot, and sleeps until one comes back or
// the stream ends; an abort overtakes queued data on the stream; closing drains
// what is queued, and gives up at its deadline.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "algorithms/collective_error.h"
#include "transport/mailbox.h"
#include "transport/ring_reader.h"
#include "transport/ring_writer.h"
#include "transport/wire_format.h"

namespace tgpg_test {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSlotBytes = 128 << 10;
constexpr size_t kBig = kSlotBytes / 2;  // goes through a slot
constexpr size_t kSmall = 100;

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return bytes;
}

// Voluntary context switches so far of this process's thread named `name`,
// or -1 if none is running: each is a sleep that ended.
long voluntary_switches_of(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    if (!std::getline(comm, got) || got != name) continue;
    std::ifstream status(task.path() / "status");
    const std::string key = "voluntary_ctxt_switches:";
    for (std::string line; std::getline(status, line);) {
      if (line.compare(0, key.size(), key) == 0) return std::stol(line.substr(key.size()));
    }
  }
  return -1;
}

tgpg::FrameHeader data_header(uint64_t offset) {
  tgpg::FrameHeader header;
  header.seq = 7;
  header.offset = offset;
  return header;
}

// What the peer's reactor would see: every message on the stream decoded and,
// after the switch, the records read by a RingReader into a mailbox, their
// slot payloads held until the test lets them go.
class RecordingStream : public tgpg::FrameStream {
 public:
  struct Received {
    tgpg::FrameHeader header;
    std::vector<std::byte> payload;
    bool through_ring = false;
    std::shared_ptr<const void> lease;
  };

  ~RecordingStream() override {
    stop_ = true;
    if (collector_.joinable()) collector_.join();
    reader_.reset();
  }

  void map(tgpg::SendRing& ring) { receiver_ = tgpg::ReceiveRing::attach(ring.offer(), kSlotBytes); }

  bool write(grpc::ByteBuffer frame) override {
    tgpg::DecodedMessage message = tgpg::decode_message(std::move(frame), kSlotBytes);
    if (message.ring_switch) {
      EXPECT_FALSE(reader_) << "a second switch";
      EXPECT_EQ(count(), switched_at_) << "frames written before the switch were counted";
      start_reading();
      return !ended_;
    }
    EXPECT_TRUE(!reader_ || message.frame.header.kind == tgpg::FrameKind::Abort)
        << "a data frame on the stream after the switch";
    EXPECT_FALSE(message.ring_slot) << "a slot named on the stream";
    Received got{message.frame.header, {}, false, nullptr};
    got.payload.resize(message.frame.payload_bytes());
    message.frame.copy_payload_to(got.payload.data());
    record(std::move(got));
    return !ended_;
  }
  bool ended() const override { return ended_; }
  void begin_close() override { closed_ = true; }
  void notify_end(std::function<void()> on_end) override {
    std::lock_guard<std::mutex> lock(end_mutex_);
    on_end_ = std::move(on_end);
    if (ended_ && on_end_) std::exchange(on_end_, nullptr)();
  }

  // The peer went away: writes fail from now on.
  void end() {
    std::lock_guard<std::mutex> lock(end_mutex_);
    ended_ = true;
    if (on_end_) std::exchange(on_end_, nullptr)();
  }

  // Slots stay held by the received frames until give_back().
  void hold_slots(bool hold) { hold_ = hold; }
  void give_back() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& r : received_) r.lease.reset();
  }
  // Waits until `n` frames arrived; false after 10 s.
  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return received_.size() >= n; });
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_.size();
  }
  std::vector<Received> received() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }
  bool closed() const { return closed_; }
  bool switched() const { return reader_ != nullptr; }

 private:
  void record(Received got) {
    std::lock_guard<std::mutex> lock(mutex_);
    received_.push_back(std::move(got));
    switched_at_ = reader_ ? switched_at_ : received_.size();
    cv_.notify_all();
  }

  void start_reading() {
    reader_ = std::make_unique<tgpg::RingReader>(receiver_, mailbox_, /*src=*/0, kSlotBytes,
                                                 tgpg::RingReader::Events{});
    collector_ = std::thread([this] {
      while (!stop_) {
        try {
          tgpg::ReceivedFrame frame = mailbox_->take(0, Clock::now() + milliseconds(50));
          Received got{frame.header, {}, /*through_ring=*/true, nullptr};
          got.payload.resize(frame.payload_bytes());
          frame.copy_payload_to(got.payload.data());
          if (hold_) got.lease = std::move(frame.owner);
          record(std::move(got));
        } catch (const tgpg::PeerTimeout&) {
        } catch (const tgpg::CollectiveError&) {
          return;
        }
      }
    });
  }

  std::shared_ptr<tgpg::ReceiveRing> receiver_;
  std::shared_ptr<tgpg::Mailbox> mailbox_ = std::make_shared<tgpg::Mailbox>(0, 1, 64, size_t{1} << 30);
  std::unique_ptr<tgpg::RingReader> reader_;
  std::thread collector_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> hold_{false};
  std::atomic<bool> ended_{false};
  std::atomic<bool> closed_{false};
  std::mutex end_mutex_;
  std::function<void()> on_end_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Received> received_;
  size_t switched_at_ = 0;  // frames received before the switch
};

// A SendRing and a writer over a recording stream, with a count of released payloads.
struct Link {
  explicit Link(uint32_t slots, bool mapped = true) {
    auto ring = std::make_unique<tgpg::SendRing>(slots, kSlotBytes);
    send_ring = ring.get();
    if (mapped) stream.map(*ring);
    writer = std::make_unique<tgpg::RingWriter>(std::move(ring), stream, [this](size_t bytes, bool through_ring) {
      (through_ring ? shared_bytes : inline_bytes) += bytes;
    });
  }
  bool send(uint64_t offset, const std::vector<std::byte>& payload) {
    return writer->send(data_header(offset), tgpg::ByteView{payload.data(), payload.size()}, [this] { ++released; });
  }
  // Sends `frames` large payloads to a receiver that holds its slots, and
  // returns once the first has arrived: the others are queued behind it.
  // False if a send was refused or nothing arrived.
  bool stall(uint64_t frames, const std::vector<std::byte>& payload) {
    stream.hold_slots(true);
    for (uint64_t i = 0; i < frames; ++i) {
      if (!send(i, payload)) return false;
    }
    return stream.wait_for(1);
  }

  RecordingStream stream;
  tgpg::SendRing* send_ring = nullptr;  // the writer's
  std::atomic<size_t> released{0};
  std::atomic<size_t> shared_bytes{0};
  std::atomic<size_t> inline_bytes{0};
  std::unique_ptr<tgpg::RingWriter> writer;
};

TEST(RingWriter, FramesKeepTheirOrderThroughRecordsAndSlots) {
  Link link(/*slots=*/2);
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 60; ++i) {
    const size_t sizes[] = {kSmall, kBig, 0, tgpg::kMaxRecordBytes - 64, tgpg::kMaxRecordBytes + 1};
    payloads.push_back(pattern(sizes[i % 5], i));
  }
  for (size_t i = 0; i < payloads.size(); ++i) ASSERT_TRUE(link.send(i, payloads[i]));
  ASSERT_TRUE(link.stream.wait_for(payloads.size()));
  EXPECT_TRUE(link.stream.switched());
  const auto got = link.stream.received();
  size_t total = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].header.offset, i);
    EXPECT_EQ(got[i].payload, payloads[i]) << "frame " << i;
    EXPECT_TRUE(got[i].through_ring) << "frame " << i;
    total += payloads[i].size();
  }
  EXPECT_EQ(link.shared_bytes.load(), total);
  EXPECT_EQ(link.inline_bytes.load(), 0u);
  EXPECT_EQ(link.released.load(), payloads.size());
}

TEST(RingWriter, FramesSentBeforeTheRingIsMappedStayAheadOfTheRecords) {
  Link link(/*slots=*/2, /*mapped=*/false);
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 8; ++i) payloads.push_back(pattern(i % 2 == 0 ? kSmall : kBig, i));
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(link.send(i, payloads[i]));
  link.stream.map(*link.send_ring);
  for (size_t i = 4; i < payloads.size(); ++i) ASSERT_TRUE(link.send(i, payloads[i]));
  ASSERT_TRUE(link.stream.wait_for(payloads.size()));
  const auto got = link.stream.received();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].header.offset, i);
    EXPECT_EQ(got[i].payload, payloads[i]) << "frame " << i;
  }
  // Before the mapping nothing waits for a slot, so each frame went on the
  // stream as it was sent; from the mapping on, each went through the ring.
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].through_ring, i >= 4) << "frame " << i;
}

TEST(RingWriter, WaitsForASlotRatherThanSendingInline) {
  Link link(/*slots=*/2);
  link.stream.hold_slots(true);
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 5; ++i) payloads.push_back(pattern(kBig, i));
  for (size_t i = 0; i < payloads.size(); ++i) ASSERT_TRUE(link.send(i, payloads[i]));
  ASSERT_TRUE(link.stream.wait_for(2));
  // Were the third payload sent inline instead, it would arrive at once.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(link.stream.count(), 2u);
  EXPECT_EQ(link.released.load(), 2u) << "a payload waiting for a slot must stay referenced";

  link.stream.hold_slots(false);
  link.stream.give_back();
  ASSERT_TRUE(link.stream.wait_for(payloads.size()));
  const auto got = link.stream.received();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].through_ring) << "frame " << i;
    EXPECT_EQ(got[i].header.offset, i);
    EXPECT_EQ(got[i].payload, payloads[i]) << "frame " << i;
  }
  EXPECT_EQ(link.released.load(), payloads.size());
  EXPECT_EQ(link.inline_bytes.load(), 0u);
}

TEST(RingWriter, AnAbortOvertakesQueuedDataAndReleasesIt) {
  Link link(/*slots=*/1);
  const auto payload = pattern(kBig, 1);
  ASSERT_TRUE(link.stall(4, payload));

  tgpg::FrameHeader abort;
  abort.kind = tgpg::FrameKind::Abort;
  abort.error = "rank 0 failed";
  ASSERT_TRUE(link.writer->send(abort, tgpg::ByteView{}, nullptr));
  ASSERT_TRUE(link.stream.wait_for(2));
  const auto got = link.stream.received();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].header.kind, tgpg::FrameKind::Abort);
  EXPECT_EQ(got[1].header.error, "rank 0 failed");
  EXPECT_EQ(link.released.load(), 4u) << "dropped payloads must be released";
}

TEST(RingWriter, ClosingWritesWhatIsQueuedFirst) {
  Link link(/*slots=*/1);
  const auto payload = pattern(kBig, 2);
  ASSERT_TRUE(link.stall(3, payload));
  link.writer->begin_close();
  EXPECT_FALSE(link.send(9, payload)) << "a closing writer takes no new frames";
  EXPECT_FALSE(link.stream.closed()) << "the stream closes only once the queue is written";

  link.stream.hold_slots(false);
  link.stream.give_back();
  link.writer->wait_closed(Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(link.stream.closed());
  // Appended before the stream closed; the reader may still be reading them.
  EXPECT_TRUE(link.stream.wait_for(3));
  EXPECT_EQ(link.stream.count(), 3u);
  EXPECT_EQ(link.released.load(), 4u);
}

TEST(RingWriter, ClosingGivesUpAtItsDeadline) {
  Link link(/*slots=*/1);
  const auto payload = pattern(kBig, 3);
  ASSERT_TRUE(link.stall(3, payload));
  link.writer->begin_close();
  const auto start = Clock::now();
  link.writer->wait_closed(start + milliseconds(100));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << "a receiver that holds its slots must not hang a close";
  EXPECT_EQ(link.stream.count(), 1u);
  EXPECT_TRUE(link.stream.closed());
  EXPECT_EQ(link.released.load(), 3u);
}

TEST(RingWriter, AWriterWaitingForRoomSleepsUntilTheReceiverGivesSomeBack) {
  Link link(/*slots=*/1);
  const auto payload = pattern(kBig, 5);
  ASSERT_TRUE(link.stall(2, payload));
  std::this_thread::sleep_for(milliseconds(100));  // the second payload's wait begins
  const long before = voluntary_switches_of("tgpg-ring-write");
  ASSERT_GE(before, 0) << "no thread named tgpg-ring-write";
  std::this_thread::sleep_for(std::chrono::seconds(1));
  // A writer that looked again every 50 ms would have woken about 20 times.
  EXPECT_LE(voluntary_switches_of("tgpg-ring-write") - before, 2);

  link.stream.hold_slots(false);
  link.stream.give_back();
  EXPECT_TRUE(link.stream.wait_for(2)) << "giving the slot back must wake the writer";
  EXPECT_EQ(link.released.load(), 2u);
}

TEST(RingWriter, AStreamThatEndsWhileTheWriterWaitsForRoomDropsWhatIsQueued) {
  Link link(/*slots=*/1);
  const auto payload = pattern(kBig, 6);
  ASSERT_TRUE(link.stall(3, payload));
  std::this_thread::sleep_for(milliseconds(100));  // the second payload's wait begins
  // The receiver still holds its slot, so only the stream's end can end the wait.
  link.stream.end();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (link.released.load() < 3 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(link.released.load(), 3u) << "the writer slept through the stream's end";
  EXPECT_EQ(link.stream.count(), 1u);
  EXPECT_FALSE(link.send(9, payload)) << "a writer whose stream ended takes no new frames";
}

TEST(RingWriter, AnUnmappedRingSendsPayloadsInline) {
  Link link(/*slots=*/2, /*mapped=*/false);
  const auto payload = pattern(kBig, 4);
  ASSERT_TRUE(link.send(0, payload));
  ASSERT_TRUE(link.stream.wait_for(1));
  const auto got = link.stream.received();
  EXPECT_FALSE(got[0].through_ring);
  EXPECT_EQ(got[0].payload, payload);
  EXPECT_EQ(link.inline_bytes.load(), kBig);
}

}  // namespace
}  // namespace tgpg_test
