// RingReader: delivers a ring's records to the mailbox in order, stops reading
// records while the mailbox's queue for the sender is full (so the sender is
// held back), delivers everything appended before the stream's end and then
// closes the source, refuses a record it cannot read by failing the group,
// and stops promptly.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "algorithms/collective_error.h"
#include "transport/mailbox.h"
#include "transport/ring_reader.h"
#include "same_host/shared_ring.h"
#include "transport/wire_format.h"

namespace tgpg_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSlotBytes = 64 << 10;
constexpr int kSrc = 1;

std::string record_with_offset(uint64_t offset) {
  tgpg::FrameHeader header;
  header.seq = 3;
  header.offset = offset;
  const std::string payload = "payload " + std::to_string(offset);
  return tgpg::encode_frame_record(header, {reinterpret_cast<const std::byte*>(payload.data()), payload.size()});
}

std::string payload_of(const tgpg::ReceivedFrame& frame) {
  std::string out(frame.payload_bytes(), '\0');
  frame.copy_payload_to(out.data());
  return out;
}

struct Reader {
  explicit Reader(size_t max_queued_frames)
      : sender(4, kSlotBytes),
        receiver(tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes)),
        mailbox(std::make_shared<tgpg::Mailbox>(0, 2, max_queued_frames, size_t{1} << 30)),
        reader(std::make_unique<tgpg::RingReader>(
            receiver, mailbox, kSrc, kSlotBytes,
            tgpg::RingReader::Events{[this] { ++drained; },
                                     [this](const std::string& reason) {
                                       refused_with = reason;
                                       ++refusals;
                                     }})) {}

  tgpg::ReceivedFrame take() { return mailbox->take(kSrc, Clock::now() + std::chrono::seconds(10)); }

  // Events come after the mailbox has been told: a receive may see it first.
  static int after_a_while(const std::atomic<int>& count) {
    for (int i = 0; i < 1000 && count.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return count.load();
  }

  tgpg::SendRing sender;
  std::shared_ptr<tgpg::ReceiveRing> receiver;
  std::shared_ptr<tgpg::Mailbox> mailbox;
  std::atomic<int> drained{0};
  std::atomic<int> refusals{0};
  std::string refused_with;
  std::unique_ptr<tgpg::RingReader> reader;
};

TEST(RingReader, DeliversInOrderAndStopsReadingWhileTheMailboxIsFull) {
  Reader r(/*max_queued_frames=*/2);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(r.sender.post(record_with_offset(i)));
  // The reader pauses after the delivery that fills the mailbox's queue: it
  // has read two records, so eight are unread and eight more fit.
  uint64_t posted = 10;
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (posted < 2 + tgpg::kRingRecords && Clock::now() < give_up) {
    if (r.sender.post(record_with_offset(posted))) ++posted;
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(posted, 2 + tgpg::kRingRecords);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(r.sender.post(record_with_offset(posted))) << "a paused reader must leave the sender's records unread";

  for (uint64_t i = 0; i < posted; ++i) {
    const tgpg::ReceivedFrame frame = r.take();
    EXPECT_EQ(frame.header.offset, i);
    EXPECT_EQ(frame.header.src_rank, static_cast<uint32_t>(kSrc)) << "the stream, not the header, names the sender";
    EXPECT_EQ(payload_of(frame), "payload " + std::to_string(i));
  }
  EXPECT_EQ(r.refusals.load(), 0);
}

TEST(RingReader, TheEndDeliversWhatWasAppendedBeforeItThenClosesTheSource) {
  Reader r(/*max_queued_frames=*/64);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(r.sender.post(record_with_offset(i)));
  r.reader->end("rank 1 closed its connection");
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(r.take().header.offset, i);
  try {
    r.take();
    ADD_FAILURE() << "the source must be closed once its records are read";
  } catch (const tgpg::PeerTimeout&) {
    ADD_FAILURE() << "the source was never closed";
  } catch (const tgpg::CollectiveError& e) {
    EXPECT_STREQ(e.what(), "rank 1 closed its connection");
  }
  EXPECT_EQ(Reader::after_a_while(r.drained), 1);
}

TEST(RingReader, AnUnreadableRecordFailsTheGroupOnce) {
  Reader r(/*max_queued_frames=*/64);
  ASSERT_TRUE(r.sender.post(record_with_offset(0)));
  ASSERT_TRUE(r.sender.post("not a frame"));
  ASSERT_TRUE(r.sender.post(record_with_offset(2)));
  // The first frame may be taken before the reader reaches the bad record;
  // after that, a failed group fails every receive.
  try {
    EXPECT_EQ(r.take().header.offset, 0u);
  } catch (const tgpg::CollectiveError&) {
  }
  EXPECT_THROW(r.take(), tgpg::CollectiveError);
  EXPECT_NE(r.mailbox->failure().find("rank 1 sent a frame through its shared ring that this rank cannot read"),
            std::string::npos)
      << r.mailbox->failure();
  ASSERT_EQ(Reader::after_a_while(r.refusals), 1);
  EXPECT_EQ(r.refused_with, r.mailbox->failure());
}

TEST(RingReader, AnAbortOrOfferInARecordIsRefused) {
  for (const bool abort : {true, false}) {
    Reader r(/*max_queued_frames=*/64);
    tgpg::FrameHeader header;
    header.kind = tgpg::FrameKind::Abort;
    header.error = "aborts travel on the stream";
    ASSERT_TRUE(r.sender.post(abort ? tgpg::encode_frame_record(header, {}) : std::string("\x4a\x00", 2)));
    EXPECT_THROW(r.take(), tgpg::CollectiveError);
    EXPECT_NE(r.mailbox->failure().find("something other than a data frame"), std::string::npos)
        << r.mailbox->failure();
  }
}

TEST(RingReader, StopsPromptlyWhileWaitingForARecord) {
  Reader r(/*max_queued_frames=*/64);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = Clock::now();
  r.reader.reset();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(r.drained.load(), 0) << "a stopped reader closes nothing";
}

}  // namespace
}  // namespace tgpg_test
