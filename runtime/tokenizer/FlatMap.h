//===- FlatMap.h - The hash tables of the BPE encoder ----------------------===//
//
// Three open-addressing tables with linear probing, because the BPE inner loop is lookups:
// the merge ranks (a pair of ids -> rank and merged id), the vocabulary by bytes (for
// ignore_merges and token lookups), and each thread's cache of pre-token -> ids. Keys of the
// string tables live in one arena, so a lookup by std::string_view allocates nothing.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TOKENIZER_FLATMAP_H
#define BONSAI_TOKENIZER_FLATMAP_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::tok {

/// Loads 8 (or 4) unaligned bytes.
inline uint64_t load64(const char *p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint64_t load32(const char *p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

/// A 64-bit hash of `bytes`, eight at a time. The tail is read with whole (overlapping) loads,
/// never assembled byte by byte in memory, which would stall the load that reads it back.
inline uint64_t hashBytes(std::string_view bytes) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  const char *p = bytes.data();
  size_t n = bytes.size();
  uint64_t h = n * k, tail;
  if (n >= 8) {
    for (size_t i = 0; i + 8 < n; i += 8) {
      h = (h ^ load64(p + i)) * k;
      h ^= h >> 29;
    }
    tail = load64(p + n - 8);
  } else if (n >= 4) {
    tail = load32(p) << 32 | load32(p + n - 4);
  } else if (n > 0) {
    tail = uint64_t(static_cast<unsigned char>(p[0])) << 16 |
           uint64_t(static_cast<unsigned char>(p[n / 2])) << 8 |
           uint64_t(static_cast<unsigned char>(p[n - 1]));
  } else {
    tail = 0;
  }
  h = (h ^ tail) * k;
  h ^= h >> 32;
  return h * k ^ (h >> 29);
}

/// Table size: a power of two at least twice `n`.
inline size_t tableSize(size_t n) {
  size_t size = 16;
  while (size < 2 * n)
    size *= 2;
  return size;
}

/// (id a, id b) -> (rank, merged id).
class PairMap {
public:
  /// What a pair merges into.
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };

  /// Sizes the table for `n` pairs; call before insert().
  void reserve(size_t n) {
    slots_.assign(tableSize(n), Slot{kEmpty, {0, 0}});
    mask_ = slots_.size() - 1;
  }
  /// Sets the merge of (a, b), replacing an earlier one.
  void insert(uint32_t a, uint32_t b, Merge merge) {
    uint64_t key = uint64_t(a) << 32 | b;
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, merge};
        return;
      }
    }
  }
  /// The merge of (a, b), or nullptr.
  const Merge *find(uint32_t a, uint32_t b) const {
    uint64_t key = uint64_t(a) << 32 | b;
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key)
        return &slots_[i].merge;
      if (slots_[i].key == kEmpty)
        return nullptr;
    }
  }

private:
  // Ids are below 2^31 (checked when loading), so no pair has this key.
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  size_t hash(uint64_t key) const { return size_t((key * 0x9e3779b97f4a7c15ull) >> 20) & mask_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

/// bytes -> a 32-bit value; keys are copied into an arena.
class StringMap {
public:
  /// Sizes the table for `n` keys; call before insert().
  void reserve(size_t n) {
    slots_.assign(tableSize(n), Slot{});
    mask_ = slots_.size() - 1;
  }
  /// Maps `key` to `value`, replacing an earlier value.
  void insert(std::string_view key, uint32_t value) {
    uint64_t h = hashBytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot &s = slots_[i];
      if (!s.used) {
        s = Slot{h, uint32_t(arena_.size()), uint32_t(key.size()), value, true};
        arena_.append(key);
        return;
      }
      if (s.hash == h && keyOf(s) == key) {
        s.value = value;
        return;
      }
    }
  }
  /// The value of `key`, or nullptr.
  const uint32_t *find(std::string_view key) const {
    uint64_t h = hashBytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot &s = slots_[i];
      if (!s.used)
        return nullptr;
      if (s.hash == h && keyOf(s) == key)
        return &s.value;
    }
  }

private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0, length = 0;
    uint32_t value = 0;
    bool used = false;
  };
  std::string_view keyOf(const Slot &s) const {
    return std::string_view(arena_).substr(s.offset, s.length);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::string arena_;
};

/// One thread's cache of pre-token bytes -> ids, emptied whenever it fills (the common
/// pre-tokens of a corpus come back at once). Slots are 16 bytes, so that the table of a
/// 16k-entry cache stays in the core's L2: every pre-token starts with a probe of it.
class PieceCache {
public:
  /// The longest key cached.
  static constexpr size_t kMaxKey = 255;

  /// Room for `capacity` entries.
  explicit PieceCache(size_t capacity) : capacity_(capacity) {
    slots_.assign(tableSize(capacity), Slot{});
    mask_ = slots_.size() - 1;
  }
  /// Appends the cached ids of `key` (at most kMaxKey bytes) to `out` and returns true, or
  /// returns false.
  bool lookup(std::string_view key, uint64_t h, std::vector<uint32_t> &out) const {
    uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot &s = slots_[i];
      if (!s.keyLength)
        return false;
      if (s.tag == tag && s.keyLength == key.size() &&
          std::memcmp(keys_.data() + s.keyOffset, key.data(), key.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.idOffset, ids_.begin() + s.idOffset + s.idCount);
        return true;
      }
    }
  }
  /// Caches `ids` (at most 255) for `key` (1 to kMaxKey bytes, not already cached).
  void store(std::string_view key, uint64_t h, const uint32_t *ids, size_t count) {
    if (size_ >= capacity_)
      clear();
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot &s = slots_[i];
      if (!s.keyLength) {
        s = Slot{uint32_t(h >> 32), uint32_t(keys_.size()), uint32_t(ids_.size()),
                 uint8_t(key.size()), uint8_t(count)};
        keys_.append(key);
        ids_.insert(ids_.end(), ids, ids + count);
        ++size_;
        return;
      }
    }
  }

private:
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    size_ = 0;
  }
  struct Slot {
    uint32_t tag = 0;
    uint32_t keyOffset = 0;
    uint32_t idOffset = 0;
    uint8_t keyLength = 0; // 0: empty
    uint8_t idCount = 0;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0, capacity_ = 0, size_ = 0;
  std::string keys_;
  std::vector<uint32_t> ids_;
};

} // namespace bonsai::tok

#endif // BONSAI_TOKENIZER_FLATMAP_H
