#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

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

}  // namespace tgpg
