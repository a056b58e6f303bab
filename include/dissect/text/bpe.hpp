// dissect/text/bpe.hpp — the BPE model of a tokenizer: a vocabulary, ranked merges, and the
// encoding of one pre-tokenized piece into token ids.
//
// Encoding follows Hugging Face: start from the piece's symbols (its bytes for a byte-level
// model, its code points otherwise), then repeatedly merge the adjacent pair whose merge ranks
// lowest, the leftmost one on a tie, until no pair has a merge. A symbol the vocabulary lacks
// becomes its UTF-8 bytes as <0xNN> tokens (byte_fallback) or the unknown token. With
// ignore_merges (LLaMA 3), a piece that is itself a token is that token.
//
// Short pieces (nearly all of them) are merged by rescanning their few pairs; long ones (a run
// of 10⁶ letters) through a heap, so a hostile input costs O(n log n), not O(n²).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/byte_level.hpp"
#include "dissect/text/normalized_text.hpp"
#include "dissect/text/utf8.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/function_ref.hpp"
#include "dissect/text/detail/lookup_tables.hpp"

namespace dissect::text {

/// How a BPE model reads its pieces and what it does with what its vocabulary lacks.
struct BpeOptions {
  bool byte_level = false;  ///< pieces are raw bytes, the vocabulary is written in GPT-2's alphabet
  bool byte_fallback = false;  ///< an unknown symbol becomes <0xNN> tokens (SentencePiece style)
  bool ignore_merges = false;  ///< a piece that is a token is taken whole (LLaMA 3)
  bool fuse_unk = false;       ///< consecutive unknown tokens become one
  std::optional<std::string> unk_token;
};

/// Which merge loop to run; `automatic` picks by piece length (tests compare the two).
enum class MergeStrategy { automatic, rescan, heap };

class BpeModel {
 public:
  /// Where an entry came from, for messages: called only when there is something to report.
  using Where = detail::FunctionRef<std::string()>;

  explicit BpeModel(BpeOptions options = {}) : options_(std::move(options)) {
    std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
    std::fill(std::begin(fallback_ids_), std::end(fallback_ids_), -1);
  }

  // ---- building --------------------------------------------------------------------------

  /// Room for `tokens` tokens and `merges` merges, so that loading does not rehash.
  void reserve(std::size_t tokens, std::size_t merges) {
    tokens_.reserve(tokens);
    file_form_.reserve(tokens, 0);
    merges_.reserve(merges);
  }

  /// Adds vocabulary entry `token` (as the file writes it) with `id`.
  /// @throws FormatError "<where>: ..." for a negative id or an id another token has.
  void add_token(std::string token, std::int32_t id, const Where& where) {
    if (id < 0) throw FormatError(concat(where(), ": id ", id, " is negative"));
    if (static_cast<std::size_t>(id) >= tokens_.size())
      tokens_.resize(static_cast<std::size_t>(id) + 1);
    if (tokens_[static_cast<std::size_t>(id)]) {
      throw FormatError(concat(where(), ": id ", id, " of \"", token, "\" is also the id of \"",
                               *tokens_[static_cast<std::size_t>(id)], "\""));
    }
    if (const auto earlier = file_form_.insert(token, id)) {
      throw FormatError(
          concat(where(), ": \"", token, "\" appears twice (ids ", *earlier, " and ", id, ")"));
    }
    tokens_[static_cast<std::size_t>(id)] = std::move(token);
  }

  /// Adds the merge `left` + `right` with the next rank. Both and their concatenation must be
  /// tokens already (Hugging Face refuses such a file too).
  /// @throws FormatError "<where>: "x" is not in the vocabulary".
  void add_merge(std::string_view left, std::string_view right, const Where& where) {
    const std::int32_t a = file_form_.find(left), b = file_form_.find(right);
    if (a < 0) throw FormatError(concat(where(), ": \"", left, "\" is not in the vocabulary"));
    if (b < 0) throw FormatError(concat(where(), ": \"", right, "\" is not in the vocabulary"));
    joined_.assign(left).append(right);  // a member: no allocation per merge
    const std::string& joined = joined_;
    const std::int32_t merged = file_form_.find(joined);
    if (merged < 0)
      throw FormatError(
          concat(where(), ": \"", joined, "\", the merge's result, is not in the vocabulary"));
    merges_.insert(a, b, {static_cast<std::int32_t>(next_rank_++), merged});
    ++merge_count_;
  }

  /// Adds the merge `left` + `right` at `rank`, which other merges may share: SentencePiece
  /// ranks merges by the score of the token they make, so every split of one token ranks
  /// alike, and equal ranks go leftmost first as in its own merge loop.
  /// @throws FormatError as add_merge, or for a negative rank.
  void add_ranked_merge(std::string_view left, std::string_view right, std::int32_t rank,
                        const Where& where) {
    if (rank < 0) throw FormatError(concat(where(), ": merge rank ", rank, " is negative"));
    const std::int32_t a = file_form_.find(left), b = file_form_.find(right);
    if (a < 0) throw FormatError(concat(where(), ": \"", left, "\" is not in the vocabulary"));
    if (b < 0) throw FormatError(concat(where(), ": \"", right, "\" is not in the vocabulary"));
    joined_.assign(left).append(right);
    const std::int32_t merged = file_form_.find(joined_);
    if (merged < 0)
      throw FormatError(
          concat(where(), ": \"", joined_, "\", the merge's result, is not in the vocabulary"));
    merges_.insert(a, b, {rank, merged});
    next_rank_ = std::max<std::size_t>(next_rank_, static_cast<std::size_t>(rank) + 1);
    ++merge_count_;
  }

  /// Completes the model once every token and merge is in.
  /// @throws FormatError naming `where` when unk_token is not a token.
  void finish(const Where& where) {
    static std::atomic<std::uint64_t> next_identity{1};
    identity_ = next_identity.fetch_add(1);  // travels with the content when the model is copied
    if (options_.unk_token) {
      unk_id_ = file_form_.find(*options_.unk_token);
      if (unk_id_ < 0)
        throw FormatError(
            concat(where(), ": unk_token \"", *options_.unk_token, "\" is not in the vocabulary"));
    }
    // The table pieces are looked up in: raw bytes for a byte-level model (a token outside the
    // alphabet cannot come out of bytes, and stays reachable only by its id).
    if (options_.byte_level) {
      piece_form_ = detail::StringTable();
      piece_form_.reserve(tokens_.size(), 0);
      std::string bytes;  // reused: no allocation per token
      for (std::size_t id = 0; id < tokens_.size(); ++id) {
        if (tokens_[id] && from_byte_level(*tokens_[id], bytes)) {
          piece_form_.insert(bytes, static_cast<std::int32_t>(id));
        }
      }
    }
    for (int b = 0; b < 256; ++b) {
      const char byte = static_cast<char>(b);
      byte_ids_[static_cast<std::size_t>(b)] =
          options_.byte_level || b < 0x80 ? pieces().find(std::string_view(&byte, 1)) : -1;
      static constexpr char hex[] = "0123456789ABCDEF";
      const char fallback[] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      fallback_ids_[static_cast<std::size_t>(b)] = file_form_.find(std::string_view(fallback, 6));
    }
  }

  // ---- reading -------------------------------------------------------------------------

  const BpeOptions& options() const { return options_; }
  /// One past the largest id (the vocabulary may have gaps).
  std::size_t id_limit() const { return tokens_.size(); }
  /// How many tokens the vocabulary holds.
  std::size_t token_count() const { return file_form_.size(); }
  /// How many merges were added.
  std::size_t merge_count() const { return merge_count_; }
  /// The token with `id` as the file writes it, or nothing for a gap or an id past the end.
  const std::string* token(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size() ||
        !tokens_[static_cast<std::size_t>(id)])
      return nullptr;
    return &*tokens_[static_cast<std::size_t>(id)];
  }
  /// The id of `token` as the file writes it, or -1.
  std::int32_t id_of(std::string_view token) const { return file_form_.find(token); }
  /// The id of the unknown token, or -1.
  std::int32_t unk_id() const { return unk_id_; }

  /// Appends the ids of `piece` to `ids`, and when `spans` is given the byte range of `piece`
  /// each covers.
  /// @throws ConfigError when a symbol has no token, no byte fallback and there is no unk_token.
  void encode(std::string_view piece, std::vector<std::int32_t>& ids,
              std::vector<Span>* spans = nullptr,
              MergeStrategy strategy = MergeStrategy::automatic) const {
    if (piece.empty()) return;
    if (options_.ignore_merges) {
      if (const std::int32_t whole = pieces().find(piece); whole >= 0) {
        ids.push_back(whole);
        if (spans) spans->push_back({0, static_cast<std::uint32_t>(piece.size())});
        return;
      }
    }
    // Words repeat: a piece seen before on this thread takes its ids from the cache.
    thread_local PieceCache cache;
    const bool cacheable =
        !spans && strategy == MergeStrategy::automatic && piece.size() <= PieceCache::longest;
    if (cacheable && cache.find(identity_, piece, ids)) return;
    const std::size_t first = ids.size();
    // One vector per thread, reused: a piece costs no allocation once it has grown.
    thread_local std::vector<Symbol> symbols;
    initial_symbols(piece, symbols);
    if (symbols.size() > 1) {
      const bool heap = strategy == MergeStrategy::heap ||
                        (strategy == MergeStrategy::automatic && symbols.size() > rescan_limit);
      heap ? merge_with_heap(symbols) : merge_by_rescanning(symbols);
    }
    emit(piece, symbols, ids, spans);
    if (cacheable)
      cache.insert(identity_, piece, std::span<const std::int32_t>(ids).subspan(first));
  }

 private:
  // A symbol of a piece: its token (-1 while the vocabulary lacks it) and its bytes.
  struct Symbol {
    std::int32_t id;
    std::uint32_t begin, end;
  };
  static constexpr std::size_t rescan_limit = 48;  // beyond this the O(n²) rescan loses to the heap

  // Piece → ids for one thread, for the model whose identity it holds (a thread that switches
  // models starts over). Bounded: when half full it is emptied, which keeps a hostile stream of
  // distinct pieces from growing it.
  struct PieceCache {
    static constexpr std::size_t longest = 32, capacity = 1 << 15;
    struct Slot {
      std::uint64_t hash = 0;
      std::uint32_t key = 0, ids = 0;
      std::uint16_t key_length = 0, id_count = 0;
      bool used = false;
    };
    std::uint64_t owner = 0;
    std::vector<Slot> slots;
    std::string keys;
    std::vector<std::int32_t> values;
    std::size_t size = 0;

    void reset(std::uint64_t model) {
      owner = model;
      slots.assign(capacity, Slot{});
      keys.clear();
      values.clear();
      size = 0;
    }
    bool find(std::uint64_t model, std::string_view piece, std::vector<std::int32_t>& out) const {
      if (owner != model || slots.empty()) return false;
      const std::uint64_t h = detail::hash_bytes(piece);
      for (std::size_t at = h & (capacity - 1);; at = (at + 1) & (capacity - 1)) {
        const Slot& slot = slots[at];
        if (!slot.used) return false;
        if (slot.hash == h && slot.key_length == piece.size() &&
            std::string_view(keys).substr(slot.key, slot.key_length) == piece) {
          out.insert(out.end(), values.begin() + slot.ids,
                     values.begin() + slot.ids + slot.id_count);
          return true;
        }
      }
    }
    void insert(std::uint64_t model, std::string_view piece, std::span<const std::int32_t> ids) {
      if (owner != model || size * 2 >= capacity) reset(model);
      const std::uint64_t h = detail::hash_bytes(piece);
      std::size_t at = h & (capacity - 1);
      while (slots[at].used) at = (at + 1) & (capacity - 1);
      slots[at] = Slot{h,
                       static_cast<std::uint32_t>(keys.size()),
                       static_cast<std::uint32_t>(values.size()),
                       static_cast<std::uint16_t>(piece.size()),
                       static_cast<std::uint16_t>(ids.size()),
                       true};
      keys.append(piece);
      values.insert(values.end(), ids.begin(), ids.end());
      ++size;
    }
  };

  // The table pieces are looked up in.
  const detail::StringTable& pieces() const {
    return options_.byte_level ? piece_form_ : file_form_;
  }

  void initial_symbols(std::string_view piece, std::vector<Symbol>& symbols) const {
    symbols.clear();
    if (options_.byte_level) {
      for (std::size_t i = 0; i < piece.size(); ++i) {
        symbols.push_back({byte_ids_[static_cast<unsigned char>(piece[i])],
                           static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i + 1)});
      }
      return;
    }
    std::size_t at = 0;
    while (at < piece.size()) {
      const auto lead = static_cast<unsigned char>(piece[at]);
      std::size_t length = lead < 0x80 ? 1 : valid_sequence_length(piece, at);
      if (length == 0) length = 1;  // not reached: text is validated before it gets here
      const std::int32_t id =
          lead < 0x80 ? byte_ids_[lead] : pieces().find(piece.substr(at, length));
      symbols.push_back(
          {id, static_cast<std::uint32_t>(at), static_cast<std::uint32_t>(at + length)});
      at += length;
    }
  }

  // ranks[i] is the merge of symbols i and i + 1 (rank -1: none), kept up to date: a merge
  // changes only its two neighbouring pairs, so each costs two lookups and a scan of the ranks.
  void merge_by_rescanning(std::vector<Symbol>& symbols) const {
    std::size_t n = symbols.size();
    thread_local std::vector<detail::PairTable::Merge> ranks;  // reused, as the symbols are
    ranks.resize(n);
    const auto pair_at = [&](std::size_t i) {
      if (symbols[i].id < 0 || symbols[i + 1].id < 0) return detail::PairTable::Merge{};
      return merges_.find(symbols[i].id, symbols[i + 1].id);
    };
    for (std::size_t i = 0; i + 1 < n; ++i) ranks[i] = pair_at(i);
    while (n > 1) {
      std::size_t best = n;
      for (std::size_t i = 0; i + 1 < n; ++i) {
        if (ranks[i].rank >= 0 && (best == n || ranks[i].rank < ranks[best].rank)) best = i;
      }
      if (best == n) break;
      symbols[best] = {ranks[best].merged, symbols[best].begin, symbols[best + 1].end};
      for (std::size_t i = best + 1; i + 1 < n; ++i) symbols[i] = symbols[i + 1];
      for (std::size_t i = best + 1; i + 2 < n; ++i) ranks[i] = ranks[i + 1];
      --n;
      if (best + 1 < n) ranks[best] = pair_at(best);
      if (best > 0) ranks[best - 1] = pair_at(best - 1);
    }
    symbols.resize(n);
  }

  // The heap holds (rank, left symbol) packed in one word, 8 bytes a candidate: a stale one (its
  // symbols merged since) is recognised by looking the pair up again, not by stored ids.
  void merge_with_heap(std::vector<Symbol>& symbols) const {
    const std::size_t n = symbols.size();
    std::vector<std::int32_t> prev(n), next(n);
    for (std::size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<std::int32_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<std::int32_t>(i + 1) : -1;
    }
    constexpr std::int32_t merged_away = -2;  // the id of a symbol merged into its left neighbour
    const auto pack = [](std::int32_t rank, std::int32_t left) {
      return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32) |
             static_cast<std::uint32_t>(left);
    };
    std::priority_queue<std::uint64_t, std::vector<std::uint64_t>, std::greater<>> queue;
    const auto consider = [&](std::int32_t left) {
      const std::int32_t right = next[static_cast<std::size_t>(left)];
      if (right < 0) return;
      const std::int32_t a = symbols[static_cast<std::size_t>(left)].id,
                         b = symbols[static_cast<std::size_t>(right)].id;
      if (a < 0 || b < 0) return;
      const auto merge = merges_.find(a, b);
      if (merge.rank >= 0) queue.push(pack(merge.rank, left));
    };
    for (std::size_t i = 0; i + 1 < n; ++i) consider(static_cast<std::int32_t>(i));
    while (!queue.empty()) {
      const std::uint64_t top = queue.top();
      queue.pop();
      const auto rank = static_cast<std::int32_t>(top >> 32);
      const auto left = static_cast<std::size_t>(top & 0xFFFFFFFFu);
      const std::int32_t right_index = next[left];
      if (symbols[left].id < 0 || right_index < 0) continue;
      const auto right = static_cast<std::size_t>(right_index);
      const auto merge = symbols[right].id < 0 ? detail::PairTable::Merge{}
                                               : merges_.find(symbols[left].id, symbols[right].id);
      if (merge.rank != rank) continue;  // stale: a neighbour changed since it was queued
      symbols[left] = {merge.merged, symbols[left].begin, symbols[right].end};
      symbols[right].id = merged_away;
      next[left] = next[right];
      if (next[right] >= 0)
        prev[static_cast<std::size_t>(next[right])] = static_cast<std::int32_t>(left);
      if (prev[left] >= 0) consider(prev[left]);
      consider(static_cast<std::int32_t>(left));
    }
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (symbols[i].id != merged_away) symbols[kept++] = symbols[i];
    }
    symbols.resize(kept);
  }

  void emit(std::string_view piece, const std::vector<Symbol>& symbols,
            std::vector<std::int32_t>& ids, std::vector<Span>* spans) const {
    bool previous_unknown = false;
    for (const Symbol& s : symbols) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        if (spans) spans->push_back({s.begin, s.end});
        previous_unknown = false;
        continue;
      }
      if (options_.byte_fallback) {
        bool covered = true;
        for (std::uint32_t i = s.begin; i < s.end; ++i)
          covered = covered && fallback_ids_[static_cast<unsigned char>(piece[i])] >= 0;
        if (covered) {
          for (std::uint32_t i = s.begin; i < s.end; ++i) {
            ids.push_back(fallback_ids_[static_cast<unsigned char>(piece[i])]);
            if (spans) spans->push_back({s.begin, s.end});
          }
          previous_unknown = false;
          continue;
        }
      }
      if (unk_id_ < 0) {
        throw ConfigError(concat("Tokenizer::encode: the vocabulary has no token for ",
                                 describe_symbol(piece.substr(s.begin, s.end - s.begin)),
                                 ", no byte fallback and no unk_token"));
      }
      if (options_.fuse_unk && previous_unknown) {
        if (spans) spans->back().end = s.end;
        continue;
      }
      ids.push_back(unk_id_);
      if (spans) spans->push_back({s.begin, s.end});
      previous_unknown = true;
    }
  }

  std::string describe_symbol(std::string_view symbol) const {
    if (options_.byte_level)
      return concat("the byte 0x", std::hex,
                    static_cast<int>(static_cast<unsigned char>(symbol[0])));
    const auto c = decode_code_point(symbol, 0);
    char code[16];
    std::snprintf(code, sizeof code, "U+%04X", c ? static_cast<unsigned>(c->value) : 0u);
    return concat('"', symbol, "\" (", code, ')');
  }

  BpeOptions options_;
  std::vector<std::optional<std::string>> tokens_;  ///< by id, as the file writes them
  detail::StringTable file_form_;                   ///< file spelling → id
  detail::StringTable piece_form_;  ///< byte-level: raw bytes → id (else file_form_ serves)
  detail::PairTable merges_;
  std::size_t merge_count_ = 0;
  std::size_t next_rank_ = 0;  ///< add_merge's: one past the largest rank so far
  std::string joined_;         ///< scratch for add_merge
  std::int32_t unk_id_ = -1;
  std::uint64_t identity_ = 0;      ///< set by finish(): which model a thread's PieceCache holds
  std::int32_t byte_ids_[256];      ///< the token of each single byte (byte-level; ASCII otherwise)
  std::int32_t fallback_ids_[256];  ///< <0xNN> of each byte
};

}  // namespace dissect::text
