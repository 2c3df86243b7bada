#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "same_host/shared_file.h"

namespace tgpg {

// One process group's shared segment on one host. Every rank of the group maps
// the same memory file: a block of control words per rank, and two sets of one
// slot per rank, which alternate from round to round so that a rank may fill
// its slot for the next round while a slower peer still reads the last.
//
// The first rank makes the file and offers it; the others open it (SharedFile's
// checks). Each rank writes only its own block and its own slots, and, in a
// reduce-scatter, the part of its own slot that it reduces in place; every
// rank reads every block and slot.
//
// Progress is a step count per rank, moved on once per phase of a round and
// waited on by the peers: by spinning for a while, then on a futex in the file.
// Each op also announces what it is (OpDescriptor) in its rank's block, so
// that ranks that called different collectives, or the same one on other
// sizes, fail at once instead of reading each other's slots as something else.
constexpr uint64_t kSegmentMagic = 0x3130676573677074;  // "tpgseg01", little-endian
// The most ranks a segment serves.
constexpr uint32_t kMaxSegmentRanks = 1024;

// What every rank must agree on about one op; see announce().
struct OpDescriptor {
  uint64_t seq = 0;        // the op's number in the group, from 1
  uint32_t op = 0;         // OpType
  uint32_t dtype = 0;      // DType
  uint64_t count = 0;      // elements, as the op's caller gave them
  uint32_t root = 0;
  uint32_t reduction = 0;  // reduction_code()
  uint32_t path = 0;       // kPathSegment, or kPathLinks when the op runs over the network links

  bool operator==(const OpDescriptor& other) const;
  bool operator!=(const OpDescriptor& other) const { return !(*this == other); }
};
constexpr uint32_t kPathLinks = 0;
constexpr uint32_t kPathSegment = 1;

// Bytes of the file for `ranks` ranks with slots of `slot_bytes`; 0 when out of bounds.
size_t segment_file_bytes(uint32_t ranks, uint64_t slot_bytes);

class Segment {
 public:
  // Throws std::runtime_error (no memfd_create, no memory, a shape out of bounds).
  static Segment create(uint32_t ranks, uint64_t slot_bytes);
  // Throws std::runtime_error saying why the offered file is refused.
  static Segment open(const SharedFileOffer& offer, uint32_t ranks, uint64_t slot_bytes);

  SharedFileOffer offer() const { return file_.offer(); }
  uint32_t ranks() const { return ranks_; }
  uint64_t slot_bytes() const { return slot_bytes_; }

  // Rank `rank`'s slot in buffer set `set` (0 or 1).
  std::byte* slot(uint32_t set, uint32_t rank) const;

  // Publishes the op this rank runs now; a peer reads it with announced().
  void announce(uint32_t rank, const OpDescriptor& op);
  // What `rank` announced last, read whole (a read that raced the rank's next
  // announce is tried again); nothing if the rank stays in the middle of an
  // announce (it died there, say).
  std::optional<OpDescriptor> announced(uint32_t rank) const;

  // This rank moves its step on to `step` (release: its slot's writes before
  // it are seen by a peer that sees the step), and wakes peers that sleep on it.
  void advance(uint32_t rank, uint32_t step);
  uint32_t step(uint32_t rank) const;  // acquire
  // Sleeps while `rank`'s step is `seen`, up to `at_most`; may return early.
  void wait_while(uint32_t rank, uint32_t seen, std::chrono::milliseconds at_most);

 private:
  Segment(SharedFile file, uint32_t ranks, uint64_t slot_bytes);
  struct RankBlock;
  RankBlock& block(uint32_t rank) const;

  SharedFile file_;
  uint32_t ranks_;
  uint64_t slot_bytes_;
};

}  // namespace tgpg
