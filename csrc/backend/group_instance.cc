#include "backend/group_instance.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "backend/store_access.h"

namespace tgpg {
namespace {

// Rank 0 looks for hellos and joins this soon, doubling up to the most: how
// late it answers a peer that came late (or whose hello replaced an earlier
// instance's) or sees a join, against how often it asks the store.
constexpr std::chrono::microseconds kFirstRecheck{100};
constexpr std::chrono::microseconds kMostRecheck{10000};
// A peer answered at the deadline gets this long to say it joined.
constexpr std::chrono::milliseconds kLastJoinGrace{1000};

// Names and nonces are new_instance_name()'s. The store is not authenticated:
// whatever else is under a hello or welcome key is not answered or joined, and
// never becomes part of a key.
bool is_instance_name(const std::string& text) {
  return !text.empty() && text.size() <= 32 &&
         std::all_of(text.begin(), text.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string hello_key(const std::string& base, int rank) { return base + "hello/" + std::to_string(rank); }

std::string welcome_key(const std::string& base, int rank, const std::string& nonce) {
  return base + "welcome/" + std::to_string(rank) + "/" + nonce;
}

std::string joined_key(const std::string& base, const std::string& name, int rank) {
  return base + name + "/joined/" + std::to_string(rank);
}

}  // namespace

std::string new_instance_name() {
  std::random_device random;
  std::ostringstream out;
  out << std::hex << random() << random() << random() << random();
  return out.str();
}

std::vector<bool> admit_peers(const c10::intrusive_ptr<c10d::Store>& store, const std::string& base,
                              const std::string& name, int size, std::chrono::steady_clock::time_point deadline) {
  std::vector<int> pending;
  for (int r = 1; r < size; ++r) pending.push_back(r);
  std::vector<std::set<std::string>> answered(size);
  // Answers the hellos there are.
  const auto answer = [&]() {
    for (int r : pending) {
      const std::string hello = hello_key(base, r);
      if (!store->check({hello})) continue;
      const std::string nonce = store_string(store, hello);
      if (is_instance_name(nonce) && answered[r].insert(nonce).second) {
        store_set(store, welcome_key(base, r, nonce), name);
      }
    }
  };
  // Each peer is answered as its hello appears and joins a round trip or two
  // later; a peer whose hello replaced an earlier instance's is read and
  // answered again on a later pass. Polled (check, then sleep), never waited
  // for as a set: a wait for every hello would answer a peer that came only
  // once the last had come, and with one that never comes, only at the
  // deadline, after the peers that came had given up on their own. Nor with a
  // short wait, which the store's client logs as a warning each time.
  auto pause = kFirstRecheck;
  bool last_round = false;
  while (true) {
    answer();
    std::vector<int> still;
    for (int r : pending) {
      if (!store->check({joined_key(base, name, r)})) still.push_back(r);
    }
    pending.swap(still);
    if (pending.empty() || last_round) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      // Peers answered at the deadline get a moment to say they joined; then the rest are absent.
      std::this_thread::sleep_for(kLastJoinGrace);
      last_round = true;
      continue;
    }
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(pause, left_until(deadline)));
    pause = std::min(pause * 2, kMostRecheck);
  }
  std::vector<bool> absent(size, false);
  for (int r : pending) absent[r] = true;
  return absent;
}

std::string join_instance(const c10::intrusive_ptr<c10d::Store>& store, const std::string& base, int rank,
                          std::chrono::steady_clock::time_point deadline) {
  const std::string nonce = new_instance_name();
  store_set(store, hello_key(base, rank), nonce);
  const std::string welcome = welcome_key(base, rank, nonce);
  if (!store_wait_for(store, {welcome}, left_until(deadline))) return "";
  const std::string name = store_string(store, welcome);
  if (!is_instance_name(name)) return "";
  store_set(store, joined_key(base, name, rank), "1");
  return name;
}

}  // namespace tgpg
