// dissect/text/detail/lookup_tables.hpp — private: do not include directly (dissect/text/bpe.hpp
// does).
//
// The two tables BPE encoding spends its time in: token bytes → id, and a pair of ids → the
// merge's rank and result. Both are open-addressing tables with linear probing over one flat
// array (the token bytes in one arena), because std::unordered_map's node per entry made every
// lookup a cache miss and loading 200,000 tokens allocate 200,000 times.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/lookup_tables.hpp is private to dissect: include dissect/text/tokenizer.hpp instead"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dissect::text::detail {

// FNV-1a over 8-byte words, then a final mix: fast on the short strings tokens are.
inline std::uint64_t hash_bytes(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ bytes.size();
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = (h ^ word) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  std::uint64_t tail = 0;
  if (i < bytes.size()) std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  h = (h ^ tail) * 0x100000001b3ull;
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  return h ^ (h >> 32);
}

inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

inline std::size_t table_capacity(std::size_t entries) {
  std::size_t capacity = 16;
  while (capacity < entries * 2) capacity *= 2;  // at most half full
  return capacity;
}

/// Bytes → id. Inserting bytes already there keeps the first id and reports it. A slot holds a
/// hash tag, the key's place in the arena and its id (16 bytes), so a lookup touches the slot
/// and, when the tags agree, the key's bytes: two cache lines.
class StringTable {
 public:
  void reserve(std::size_t entries, std::size_t bytes) {
    arena_.reserve(bytes);
    if (table_capacity(entries) > slots_.size()) rehash(table_capacity(entries));
  }

  /// Adds `key` → `id`; returns the id `key` already had, if any (the table keeps that one).
  std::optional<std::int32_t> insert(std::string_view key, std::int32_t id) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(table_capacity(size_ + 1));
    const std::uint64_t h = hash_bytes(key);
    const auto tag = static_cast<std::uint32_t>(h >> 32);
    std::size_t at = h & (slots_.size() - 1);
    while (slots_[at].id >= 0) {
      if (slots_[at].tag == tag && view(slots_[at]) == key) return slots_[at].id;
      at = (at + 1) & (slots_.size() - 1);
    }
    slots_[at] = Slot{tag, static_cast<std::uint32_t>(arena_.size()),
                      static_cast<std::uint32_t>(key.size()), id};
    arena_.append(key);
    ++size_;
    return std::nullopt;
  }

  /// The id of `key`, or -1.
  std::int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const std::uint64_t h = hash_bytes(key);
    const auto tag = static_cast<std::uint32_t>(h >> 32);
    std::size_t at = h & (slots_.size() - 1);
    while (slots_[at].id >= 0) {
      const Slot& slot = slots_[at];
      if (slot.tag == tag && slot.length == key.size() &&
          std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0) {
        return slot.id;
      }
      at = (at + 1) & (slots_.size() - 1);
    }
    return -1;
  }

  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::uint32_t tag = 0, offset = 0, length = 0;
    std::int32_t id = -1;
  };
  std::string_view view(const Slot& slot) const {
    return std::string_view(arena_).substr(slot.offset, slot.length);
  }
  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    for (const Slot& slot : old) {
      if (slot.id < 0) continue;
      std::size_t at = hash_bytes(view(slot)) & (capacity - 1);
      while (slots_[at].id >= 0) at = (at + 1) & (capacity - 1);
      slots_[at] = slot;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  std::size_t size_ = 0;
};

/// (left id, right id) → (rank, merged id). Inserting a pair again replaces it, as both
/// Hugging Face and transformers.js do: the later merge's rank counts.
class PairTable {
 public:
  struct Merge {
    std::int32_t rank = -1;
    std::int32_t merged = -1;
  };

  void reserve(std::size_t entries) { rehash(table_capacity(entries)); }

  void insert(std::int32_t left, std::int32_t right, Merge merge) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(table_capacity(size_ + 1));
    const std::uint64_t key = pack(left, right);
    std::size_t at = mix64(key) & (slots_.size() - 1);
    while (slots_[at].merge.rank >= 0) {
      if (slots_[at].key == key) {
        slots_[at].merge = merge;
        return;
      }
      at = (at + 1) & (slots_.size() - 1);
    }
    slots_[at] = Slot{key, merge};
    ++size_;
  }

  /// The merge of (left, right), or rank -1.
  Merge find(std::int32_t left, std::int32_t right) const {
    if (slots_.empty()) return {};
    const std::uint64_t key = pack(left, right);
    std::size_t at = mix64(key) & (slots_.size() - 1);
    while (slots_[at].merge.rank >= 0) {
      if (slots_[at].key == key) return slots_[at].merge;
      at = (at + 1) & (slots_.size() - 1);
    }
    return {};
  }

  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::uint64_t key = 0;
    Merge merge;
  };
  static std::uint64_t pack(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
           static_cast<std::uint32_t>(right);
  }
  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    for (const Slot& slot : old) {
      if (slot.merge.rank < 0) continue;
      std::size_t at = mix64(slot.key) & (capacity - 1);
      while (slots_[at].merge.rank >= 0) at = (at + 1) & (capacity - 1);
      slots_[at] = slot;
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace dissect::text::detail
