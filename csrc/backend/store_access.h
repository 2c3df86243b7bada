#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tgpg {

// The c10d store's values as text.
inline std::string store_string(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

inline void store_set(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                      const std::string& value) {
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

// Several values in one request: across a long link each store request costs
// a round trip (a get two: TCPStore waits for the key first), and a group's
// setup reads one value per rank several times over.
inline std::vector<std::string> store_strings(const c10::intrusive_ptr<c10d::Store>& store,
                                              const std::vector<std::string>& keys) {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& bytes : store->multiGet(keys)) values.emplace_back(bytes.begin(), bytes.end());
  return values;
}

// The values of the keys that exist, never waiting for one that does not: in
// one request when all exist, else key by key.
inline std::vector<std::optional<std::string>> store_strings_present(const c10::intrusive_ptr<c10d::Store>& store,
                                                                     const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> values(keys.size());
  if (keys.empty()) return values;
  if (store->check(keys)) {
    std::vector<std::string> all = store_strings(store, keys);
    for (size_t i = 0; i < keys.size(); ++i) values[i] = std::move(all[i]);
    return values;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (store->check({keys[i]})) values[i] = store_string(store, keys[i]);
  }
  return values;
}

// Time left until `deadline` as a store timeout: at least 1 ms, since the
// deadline may have passed and a store takes no timeout of 0.
inline std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// Whether every key exists within `timeout`; a timeout is an answer, not an
// exception. (TCPStore's client logs a warning for each wait that times out:
// wait only where the keys are expected, and poll with check() elsewhere.)
inline bool store_wait_for(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  if (keys.empty()) return true;
  try {
    store->wait(keys, timeout);
    return true;
  } catch (const std::exception&) {
    return store->check(keys);  // it may have arrived just now
  }
}

}  // namespace tgpg
