// SendRing / ReceiveRing: payloads round-trip through the shared file, put()
// finds no slot while the receiver holds every one, a sender waiting for a
// release wakes when a slot or record comes back (or is interrupted), records
// arrive in order and wake a waiting receiver, and the receiver refuses every
// offer and slot reference it cannot trust.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "same_host/shared_ring.h"

namespace tgpg_test {
namespace {

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 64 << 10;

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return bytes;
}

tgpg::ByteView view(const std::vector<std::byte>& bytes) { return {bytes.data(), bytes.size()}; }

std::vector<std::byte> contents(tgpg::ByteView v) { return {v.data, v.data + v.size}; }

// A descriptor closed at the end of the test.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {
    if (fd_ < 0) throw std::runtime_error("could not make a file for the test");
  }
  ~Fd() { ::close(fd_); }
  int get() const { return fd_; }

 private:
  int fd_;
};

TEST(SharedRing, PayloadRoundTripsOnceTheReceiverMapsTheRing) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  const auto data = pattern(kSlotBytes, 1);
  EXPECT_FALSE(sender.put(view(data))) << "nothing goes into a ring the receiver has not mapped";

  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  const auto slot = sender.put(view(data));
  ASSERT_TRUE(slot);
  EXPECT_EQ(slot->bytes, data.size());
  auto [payload, lease] = receiver->take(*slot);
  EXPECT_EQ(contents(payload), data);
}

TEST(SharedRing, SenderFallsBackWhileTheReceiverHoldsEverySlot) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  std::vector<std::shared_ptr<const void>> leases;
  std::vector<std::vector<std::byte>> sent;
  for (uint32_t i = 0; i < kSlots; ++i) {
    sent.push_back(pattern(1000 + i, static_cast<int>(i)));
    const auto slot = sender.put(view(sent.back()));
    ASSERT_TRUE(slot) << "slot " << i;
    auto [payload, lease] = receiver->take(*slot);
    EXPECT_EQ(contents(payload), sent.back());
    leases.push_back(std::move(lease));
  }
  const auto more = pattern(10, 9);
  EXPECT_FALSE(sender.put(view(more))) << "every slot is held: the payload must go inline";

  // Giving one back frees exactly that slot; the others keep their data.
  leases[2].reset();
  const auto slot = sender.put(view(more));
  ASSERT_TRUE(slot);
  EXPECT_EQ(slot->index, 2u);
  EXPECT_FALSE(sender.put(view(more)));
}

// Fills every slot, each held by a lease.
std::vector<std::shared_ptr<const void>> hold_every_slot(tgpg::SendRing& sender, tgpg::ReceiveRing& receiver) {
  std::vector<std::shared_ptr<const void>> leases;
  const auto data = pattern(100, 5);
  for (uint32_t i = 0; i < kSlots; ++i) leases.push_back(receiver.take(*sender.put(view(data))).second);
  return leases;
}

// How long wait_for_release(seen, at_most) took, run on another thread while
// `then` runs here 100 ms after it began; `seen` is read before either.
template <typename Fn>
std::chrono::milliseconds time_wait(tgpg::SendRing& sender, std::chrono::milliseconds at_most, Fn&& then) {
  const uint32_t seen = sender.releases();
  auto waited = std::async(std::launch::async, [&] {
    const auto start = std::chrono::steady_clock::now();
    sender.wait_for_release(seen, at_most);
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  then();
  return waited.get();
}

// The waits below allow 20 s, and a wake counts when it comes in under 10 s:
// a side that missed its wake-up would sleep the whole 20.
constexpr std::chrono::milliseconds kLongWait{20000};
constexpr std::chrono::milliseconds kWokenWithin{10000};

TEST(SharedRing, AWaitingSenderWakesWhenASlotComesBack) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  auto leases = hold_every_slot(sender, *receiver);
  const auto waited = time_wait(sender, kLongWait, [&] { leases[1].reset(); });
  EXPECT_LT(waited, kWokenWithin);
  EXPECT_TRUE(sender.put(view(pattern(10, 0))));
}

TEST(SharedRing, AReleaseBeforeTheWaitEndsItAtOnce) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  auto leases = hold_every_slot(sender, *receiver);
  const uint32_t seen = sender.releases();
  leases[0].reset();
  const auto start = std::chrono::steady_clock::now();
  sender.wait_for_release(seen, kLongWait);
  EXPECT_LT(std::chrono::steady_clock::now() - start, kWokenWithin);
}

TEST(SharedRing, InterruptEndsEveryWait) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  auto leases = hold_every_slot(sender, *receiver);
  const auto waited = time_wait(sender, kLongWait, [&] { sender.interrupt(); });
  EXPECT_LT(waited, kWokenWithin);
  EXPECT_LT(time_wait(sender, kLongWait, [] {}), kWokenWithin) << "a later wait must not sleep either";
  EXPECT_FALSE(sender.put(view(pattern(10, 0)))) << "every slot is still held";
}

TEST(SharedRing, RecordsArriveInOrderAndComeBackWhenRead) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  EXPECT_FALSE(sender.post("early")) << "no record goes into a ring the receiver has not mapped";
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  EXPECT_FALSE(receiver->take_record());
  for (uint32_t i = 0; i < tgpg::kRingRecords; ++i) {
    ASSERT_TRUE(sender.post("record " + std::to_string(i))) << i;
  }
  EXPECT_FALSE(sender.post("one too many")) << "the receiver has read none of the queue";
  EXPECT_FALSE(sender.post(std::string(tgpg::kMaxRecordBytes + 1, 'x')));

  const uint32_t seen = sender.releases();
  EXPECT_EQ(receiver->take_record(), "record 0");
  EXPECT_NE(sender.releases(), seen) << "a record read is a release the sender may wait for";
  const std::string longest(tgpg::kMaxRecordBytes, 'y');
  ASSERT_TRUE(sender.post(longest));
  for (uint32_t i = 1; i < tgpg::kRingRecords; ++i) EXPECT_EQ(receiver->take_record(), "record " + std::to_string(i));
  EXPECT_EQ(receiver->take_record(), longest);
  EXPECT_FALSE(receiver->take_record());
  // Past the queue's end, records wrap around.
  for (int round = 0; round < 3 * static_cast<int>(tgpg::kRingRecords); ++round) {
    ASSERT_TRUE(sender.post(std::to_string(round)));
    EXPECT_EQ(receiver->take_record(), std::to_string(round));
  }
}

TEST(SharedRing, AWaitingReceiverWakesWhenARecordIsAppended) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  auto waited = std::async(std::launch::async, [&] {
    const auto start = std::chrono::steady_clock::now();
    receiver->wait_for_record(receiver->wake_count(), kLongWait);
    return std::chrono::steady_clock::now() - start;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(sender.post("wake up"));
  EXPECT_LT(waited.get(), kWokenWithin);
  EXPECT_EQ(receiver->take_record(), "wake up");

  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sender.post("already there"));
  receiver->wait_for_record(receiver->wake_count(), kLongWait);
  EXPECT_LT(std::chrono::steady_clock::now() - start, kWokenWithin) << "a record waiting already ends the wait";
}

TEST(SharedRing, AWaitingReceiverWakesWhenWokenAndNotBefore) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  const auto idle = std::chrono::milliseconds(500);
  auto start = std::chrono::steady_clock::now();
  receiver->wait_for_record(receiver->wake_count(), idle);
  EXPECT_GE(std::chrono::steady_clock::now() - start, idle) << "nothing happened, so the wait sleeps its whole bound";

  auto waited = std::async(std::launch::async, [&] {
    const auto begun = std::chrono::steady_clock::now();
    receiver->wait_for_record(receiver->wake_count(), kLongWait);
    return std::chrono::steady_clock::now() - begun;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  receiver->wake_reader();
  EXPECT_LT(waited.get(), kWokenWithin);
}

// The race a stopping reader meets: it has looked for a stop and found none,
// and the stop's wake comes before it sleeps. The count it read first ends
// that sleep at once.
TEST(SharedRing, AWakeBetweenTheLookAndTheWaitEndsItAtOnce) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  const uint32_t seen = receiver->wake_count();
  receiver->wake_reader();
  const auto start = std::chrono::steady_clock::now();
  receiver->wait_for_record(seen, kLongWait);
  EXPECT_LT(std::chrono::steady_clock::now() - start, kWokenWithin);
}

TEST(SharedRing, PayloadLargerThanASlotGoesInline) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  EXPECT_FALSE(sender.put(view(pattern(kSlotBytes + 1, 0))));
}

TEST(SharedRing, LeaseOutlivesTheReceiversHandle) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  const auto data = pattern(4096, 3);
  auto [payload, lease] = receiver->take(*sender.put(view(data)));
  receiver.reset();  // the stream ended; a queued frame still holds its slot
  EXPECT_EQ(contents(payload), data);
  lease.reset();     // unmaps here; the sanitizers see any use after it
}

TEST(SharedRing, ReceiverRefusesBadSlotReferences) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  auto receiver = tgpg::ReceiveRing::attach(sender.offer(), kSlotBytes);
  const auto data = pattern(100, 4);
  const tgpg::RingSlot good = *sender.put(view(data));

  EXPECT_THROW(receiver->take({kSlots, good.seq, good.bytes}), std::runtime_error) << "index out of range";
  EXPECT_THROW(receiver->take({good.index, good.seq, kSlotBytes + 1}), std::runtime_error) << "more than a slot";
  EXPECT_THROW(receiver->take({good.index, good.seq + 1, good.bytes}), std::runtime_error) << "another put's seq";
  EXPECT_THROW(receiver->take({(good.index + 1) % kSlots, 1, 10}), std::runtime_error) << "a slot never filled";

  auto held = receiver->take(good);
  EXPECT_THROW(receiver->take(good), std::runtime_error) << "a slot still held by an earlier frame";
  held.second.reset();
  EXPECT_THROW(receiver->take(good), std::runtime_error) << "a slot already given back";
}

TEST(SharedRing, ReceiverRefusesOffersOfTheWrongShape) {
  tgpg::SendRing sender(kSlots, kSlotBytes);
  tgpg::RingOffer offer = sender.offer();
  EXPECT_THROW(tgpg::ReceiveRing::attach(offer, kSlotBytes * 2), std::runtime_error) << "another chunk size";

  tgpg::RingOffer bad = offer;
  bad.slots = 0;
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "no slots";
  bad.slots = tgpg::kMaxRingSlots + 1;
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "too many slots";
  bad = offer;
  bad.slots = kSlots - 1;
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "a size the file does not have";
  bad = offer;
  bad.token[0] = static_cast<char>(bad.token[0] ^ 1);
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "another token";
  bad = offer;
  bad.token.resize(8);
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "a short token";
  bad = offer;
  bad.pid = 0;
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "no process";
  bad = offer;
  bad.fd = 1 << 20;
  EXPECT_THROW(tgpg::ReceiveRing::attach(bad, kSlotBytes), std::runtime_error) << "no such descriptor";

  // The refusals left the ring unmapped: the sender still sends inline.
  EXPECT_FALSE(sender.put(view(pattern(10, 0))));
}

TEST(SharedRing, ReceiverRefusesFilesThatAreNotSealedMemoryFiles) {
  const tgpg::RingOffer genuine = tgpg::SendRing(kSlots, kSlotBytes).offer();
  const size_t bytes = tgpg::ring_file_bytes(kSlots, kSlotBytes);

  // A regular file of the right size: a forged offer must not make a rank map
  // (and later write to) any file its peer names.
  char path[] = "/tmp/tgpg-ring-test-XXXXXX";
  Fd regular(::mkstemp(path));
  ::unlink(path);
  ASSERT_EQ(::ftruncate(regular.get(), static_cast<off_t>(bytes)), 0);
  tgpg::RingOffer offer = genuine;
  offer.pid = static_cast<uint32_t>(::getpid());
  offer.fd = regular.get();
  EXPECT_THROW(tgpg::ReceiveRing::attach(offer, kSlotBytes), std::runtime_error) << "a regular file";

  // A memory file that could still shrink under the mapping (SIGBUS on read).
  Fd unsealed(::memfd_create("torch_grpc_pg-ring", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(bytes)), 0);
  offer.fd = unsealed.get();
  EXPECT_THROW(tgpg::ReceiveRing::attach(offer, kSlotBytes), std::runtime_error) << "an unsealed memory file";

  // Sealed and of the right size, but without the token: not the offered file.
  Fd sealed(::memfd_create("torch_grpc_pg-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(sealed.get(), static_cast<off_t>(bytes)), 0);
  ASSERT_EQ(::fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  offer.fd = sealed.get();
  EXPECT_THROW(tgpg::ReceiveRing::attach(offer, kSlotBytes), std::runtime_error) << "a file without the token";

  // A pipe is not a memory file; opening it must not even be tried.
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  Fd read_end(ends[0]);
  Fd write_end(ends[1]);
  offer.fd = read_end.get();
  EXPECT_THROW(tgpg::ReceiveRing::attach(offer, kSlotBytes), std::runtime_error) << "a pipe";
}

// A peer that cuts its file between the receiver's checks: the file is of the
// right size and unsealed when offered, and is shrunk and sealed just as the
// receiver asks for its seals. A receiver that had checked the size before the
// seals passes both checks and maps a file that ends early, to die of SIGBUS
// reading it. The receiver runs in a child process that this test traces, so
// the cut lands exactly at that moment on every run.
TEST(SharedRing, AFileCutAsItsSealsAreCheckedIsNeverMapped) {
  const size_t bytes = tgpg::ring_file_bytes(kSlots, kSlotBytes);
  const std::string token(32, '\x6b');
  Fd file(::memfd_create("torch_grpc_pg-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(file.get(), static_cast<off_t>(bytes)), 0);
  // A genuine header: only the cut may give the file away.
  const uint64_t magic = 0x31676e6972677074;  // "tpgring1"
  ASSERT_EQ(::pwrite(file.get(), &magic, sizeof(magic), 0), static_cast<ssize_t>(sizeof(magic)));
  ASSERT_EQ(::pwrite(file.get(), token.data(), token.size(), 8), static_cast<ssize_t>(token.size()));

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    ::raise(SIGSTOP);
    const tgpg::RingOffer offer{static_cast<uint32_t>(::getpid()), file.get(), kSlots, kSlotBytes, token};
    try {
      tgpg::ReceiveRing::attach(offer, kSlotBytes);
      ::_exit(0);  // mapped
    } catch (const std::exception&) {
      ::_exit(1);  // refused
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  ASSERT_EQ(::ptrace(PTRACE_SETOPTIONS, child, nullptr, PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL), 0);
  bool cut = false;
  for (;;) {
    ASSERT_EQ(::ptrace(PTRACE_SYSCALL, child, nullptr, nullptr), 0);
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    if (WIFEXITED(status) || WIFSIGNALED(status)) break;
    if (!WIFSTOPPED(status) || WSTOPSIG(status) != (SIGTRAP | 0x80)) continue;
    __ptrace_syscall_info info = {};
    ASSERT_GT(::ptrace(PTRACE_GET_SYSCALL_INFO, child, sizeof(info), &info), 0);
    if (!cut && info.op == PTRACE_SYSCALL_INFO_ENTRY && info.entry.nr == SYS_fcntl &&
        info.entry.args[1] == F_GET_SEALS) {
      ASSERT_EQ(::ftruncate(file.get(), 4096), 0);
      ASSERT_EQ(::fcntl(file.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
      cut = true;
    }
  }
  EXPECT_TRUE(cut) << "the receiver never asked for the file's seals";
  ASSERT_TRUE(WIFEXITED(status)) << "the receiver died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1) << "the receiver mapped a file cut to 4096 of its " << bytes << " bytes";
}

TEST(SharedRing, FileBytesBoundTheShape) {
  EXPECT_EQ(tgpg::ring_file_bytes(0, kSlotBytes), 0u);
  EXPECT_EQ(tgpg::ring_file_bytes(tgpg::kMaxRingSlots + 1, kSlotBytes), 0u);
  EXPECT_EQ(tgpg::ring_file_bytes(1, 0), 0u);
  EXPECT_EQ(tgpg::ring_file_bytes(1, (uint64_t{1} << 32) + 1), 0u);
  EXPECT_GE(tgpg::ring_file_bytes(kSlots, kSlotBytes), kSlots * kSlotBytes);
  EXPECT_THROW(tgpg::SendRing(0, kSlotBytes), std::runtime_error);
}

}  // namespace
}  // namespace tgpg_test
