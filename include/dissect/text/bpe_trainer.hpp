// dissect/text/bpe_trainer.hpp — learns a byte-level BPE vocabulary from text, as GPT-2's was
// learned (the model of Hugging Face's BpeTrainer and Karpathy's minbpe), and writes it as a
// tokenizer.json that Tokenizer, Hugging Face and transformers.js load: a tokenizer for a model
// trained from scratch, or a small vocabulary to watch BPE at work on a corpus.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/added_tokens.hpp"
#include "dissect/text/byte_level.hpp"
#include "dissect/text/pre_tokenizer.hpp"
#include "dissect/text/tokenizer.hpp"
#include "dissect/text/utf8.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/json_cursor.hpp"
#include "dissect/text/detail/lookup_tables.hpp"

namespace dissect::text {

/// What BpeTrainer learns.
struct BpeTrainerOptions {
  /// How many merges to learn, 1..10⁷: at most, since training stops early when no pair is
  /// frequent enough. The vocabulary is the 256 bytes, one token per merge, the special tokens.
  std::size_t merges = 0;
  /// A pair seen fewer times than this (weighted by word frequency) is never merged: the default
  /// 2 keeps merges from spelling out words that occur once.
  std::uint64_t min_frequency = 2;
  /// Added tokens ("<|endoftext|>"), with the ids after the learned tokens. Their occurrences in
  /// the training text are cut out before counting, as encoding cuts them out before the model
  /// sees the text.
  std::vector<std::string> special_tokens = {};  // "= {}" spares {.merges = n} a -Wextra warning
};

/// One learned merge: `left` followed by `right` becomes `id`.
struct BpeMerge {
  std::int32_t left = 0, right = 0;
  std::int32_t id = 0;
  /// How often the pair occurred when it was chosen, summed over the words weighted by their
  /// frequency. Never increases along the merge list, since a pair's count only falls once it
  /// exists (barring two merges that spell one token, which no corpus we tried produced).
  std::uint64_t count = 0;
};

/// A trained vocabulary.
struct TrainedBpe {
  std::vector<std::string> tokens;  ///< by id, the bytes each stands for; 0..255 are the bytes
  std::vector<BpeMerge> merges;     ///< in the order learned, which is their rank
  std::vector<std::string> special_tokens;  ///< special token i has id tokens.size() + i
  std::uint64_t words = 0;                  ///< pre-tokenized words trained on, repeats included
  std::size_t distinct_words = 0;

  std::size_t vocab_size() const { return tokens.size() + special_tokens.size(); }

  /// The vocabulary as a tokenizer.json: GPT-2's pipeline (ByteLevel pre-tokenizer, post-processor
  /// and decoder, no normalizer), the BPE model with its vocabulary in GPT-2's byte-level alphabet
  /// and its merges as [a, b] pairs, the special tokens as added tokens. The same vocabulary
  /// gives the same text, byte for byte: one vocabulary entry and one merge a line, by id.
  std::string to_tokenizer_json() const;

  /// A Tokenizer reading to_tokenizer_json(); `source` starts its messages.
  Tokenizer to_tokenizer(std::string_view source = "trained BPE") const {
    return Tokenizer::from_json(to_tokenizer_json(), source);
  }
};

/// Learns byte-level BPE merges from text fed to it piece by piece.
///
/// Each text is cut into words by GPT-2's ByteLevel pre-tokenizer (the tokenizer.json this
/// writes encodes with the same one), after its special tokens are cut out; only the count of
/// each distinct word is kept, not the text. Training starts from the 256 single bytes, ids 0..255
/// in byte order, and repeatedly merges the adjacent pair of tokens that occurs most often over
/// all words, weighted by their counts; the merged token takes the next id. Within a word the
/// pair is merged left to right ("aaa" with a + a becomes "aa" "a").
///
/// **Ties**: among pairs with equal counts the one whose (left id, right id) is smallest wins,
/// Hugging Face BpeTrainer's rule (its ids order its alphabet by code point, not by byte, so
/// its choice among tied pairs can differ from this one's on the same text).
///
/// Training stops after `merges` merges or when the best pair occurs fewer than `min_frequency`
/// times. Counts are kept up to date incrementally: each pair knows the words it occurs in, a
/// merge rewrites only those words, and the best pair comes from a max-heap whose stale entries
/// are corrected as they surface. Learning 2,000 merges from 1 MB of text takes a fraction of a
/// second.
class BpeTrainer {
 public:
  /// @throws ConfigError naming the option: merges 0 or above 10⁷, a special token that is
  ///         empty, not UTF-8 or given twice.
  explicit BpeTrainer(BpeTrainerOptions options);

  /// Counts the words of `text` (UTF-8); the text itself is not kept.
  /// @throws FormatError "BpeTrainer::add_text: text 3 is not UTF-8: byte 0xff at offset 17"
  ///         (texts are numbered from 0 in the order they were added).
  void add_text(std::string_view text);

  std::size_t texts() const { return texts_; }
  std::size_t distinct_words() const { return counts_.size(); }

  /// Learns the merges from the words counted so far. The counts stay: more text may be added
  /// and train() called again.
  /// @throws ConfigError when a special token is spelled like a token of the vocabulary in the
  ///         byte-level alphabet ("a", "Ġthe"): the tokenizer.json would hold that key twice.
  TrainedBpe train() const;

  const BpeTrainerOptions& options() const { return options_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return detail::hash_bytes(s); }
  };

  BpeTrainerOptions options_;
  PreTokenizer pre_tokenizer_;
  AddedTokenMatcher specials_;
  std::unordered_map<std::string, std::uint64_t, Hash, std::equal_to<>> counts_;  ///< word → count
  std::size_t texts_ = 0;

  static PreTokenizer gpt2_pre_tokenizer() {
    static const nlohmann::json spec = nlohmann::json::parse(
        R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})");
    return PreTokenizer::from_json(detail::JsonCursor(spec, "", "BpeTrainer"));
  }
  void count_section(std::string_view section) {
    if (section.empty()) return;
    pre_tokenizer_.split(Piece{section, nullptr, Span{}}, [&](const Piece& word) {
      const auto found = counts_.find(word.text);
      if (found != counts_.end()) {
        ++found->second;
      } else {
        counts_.emplace(std::string(word.text), 1);
      }
    });
  }
};

/// Trains on `texts` in one call.
/// @throws as BpeTrainer's constructor, add_text (naming the index in `texts`) and train().
inline TrainedBpe train_bpe(std::span<const std::string_view> texts, BpeTrainerOptions options) {
  BpeTrainer trainer(std::move(options));
  for (const std::string_view text : texts) trainer.add_text(text);
  return trainer.train();
}
inline TrainedBpe train_bpe(std::span<const std::string> texts, BpeTrainerOptions options) {
  BpeTrainer trainer(std::move(options));
  for (const std::string& text : texts) trainer.add_text(text);
  return trainer.train();
}

// ============================================================================================
// Implementation
// ============================================================================================

inline BpeTrainer::BpeTrainer(BpeTrainerOptions options)
    : options_(std::move(options)), pre_tokenizer_(gpt2_pre_tokenizer()) {
  constexpr std::size_t most_merges = 10'000'000;  // far beyond any vocabulary; ids stay int32
  if (options_.merges == 0) {
    throw ConfigError("BpeTrainerOptions::merges is 0: ask for at least one merge");
  }
  if (options_.merges > most_merges) {
    throw ConfigError(
        concat("BpeTrainerOptions::merges is ", options_.merges, ", above ", most_merges));
  }
  const auto& specials = options_.special_tokens;
  for (std::size_t i = 0; i < specials.size(); ++i) {
    const auto where = [&] { return concat("BpeTrainerOptions::special_tokens[", i, "]"); };
    if (specials[i].empty()) throw ConfigError(concat(where(), " is empty"));
    if (const auto bad = first_invalid_utf8(specials[i])) {
      throw ConfigError(concat(where(), " is not UTF-8 (offset ", *bad, ")"));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (specials[j] == specials[i]) {
        throw ConfigError(
            concat(where(), " \"", specials[i], "\" is also special_tokens[", j, "]"));
      }
    }
    AddedToken token;
    token.content = specials[i];
    token.special = true;
    specials_.add(token);
  }
}

inline void BpeTrainer::add_text(std::string_view text) {
  const std::size_t index = texts_++;
  if (const auto bad = first_invalid_utf8(text)) {
    throw FormatError(concat("BpeTrainer::add_text: text ", index, " is not UTF-8: byte 0x",
                             std::hex, static_cast<int>(static_cast<unsigned char>(text[*bad])),
                             std::dec, " at offset ", *bad));
  }
  std::size_t at = 0;
  for (const AddedTokenMatch& match : specials_.find_all(text)) {
    count_section(text.substr(at, match.begin - at));
    at = match.end;
  }
  count_section(text.substr(at));
}

inline TrainedBpe BpeTrainer::train() const {
  TrainedBpe out;
  out.special_tokens = options_.special_tokens;
  out.distinct_words = counts_.size();

  // The words, in byte order so that nothing depends on the hash map's: each a run of token ids
  // in one arena, which merges shorten in place.
  struct Word {
    std::size_t begin;
    std::uint32_t length;
    std::uint64_t count;
  };
  std::vector<const std::pair<const std::string, std::uint64_t>*> sorted;
  sorted.reserve(counts_.size());
  std::size_t total_bytes = 0;
  for (const auto& entry : counts_) {
    sorted.push_back(&entry);
    total_bytes += entry.first.size();
  }

  // Each merge shortens some word by a symbol at least, so there are fewer merges than the
  // words have bytes: that bounds the room reserved for an option of 10⁷.
  const std::size_t most_tokens = 256 + std::min(options_.merges, total_bytes);
  out.tokens.reserve(most_tokens);
  detail::StringTable token_ids;  // bytes → id, to find a merge whose result is already a token
  token_ids.reserve(most_tokens, 0);
  for (int b = 0; b < 256; ++b) {
    out.tokens.emplace_back(1, static_cast<char>(b));
    token_ids.insert(out.tokens.back(), b);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  std::vector<std::int32_t> symbols;
  symbols.reserve(total_bytes);
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto* entry : sorted) {
    words.push_back(
        {symbols.size(), static_cast<std::uint32_t>(entry->first.size()), entry->second});
    for (const char c : entry->first) symbols.push_back(static_cast<unsigned char>(c));
    out.words += entry->second;
  }

  // Every adjacent pair of ids with its count and the words it occurs in. The list may name
  // words that no longer hold the pair (a merge removed it): merging skips those.
  struct PairStats {
    std::int32_t left, right;
    std::uint64_t count = 0;
    std::vector<std::uint32_t> words;
  };
  std::vector<PairStats> pairs;
  detail::PairTable pair_index;  // (left, right) → index into pairs, kept in the "rank" field
  const auto index_of = [&](std::int32_t left, std::int32_t right) {
    const std::int32_t found = pair_index.find(left, right).rank;
    if (found >= 0) return static_cast<std::size_t>(found);
    pair_index.insert(left, right, {static_cast<std::int32_t>(pairs.size()), 0});
    pairs.push_back({left, right, 0, {}});
    return pairs.size() - 1;
  };
  for (std::size_t w = 0; w < words.size(); ++w) {
    const std::int32_t* s = symbols.data() + words[w].begin;
    for (std::uint32_t i = 0; i + 1 < words[w].length; ++i) {
      PairStats& stats = pairs[index_of(s[i], s[i + 1])];
      stats.count += words[w].count;
      if (stats.words.empty() || stats.words.back() != w)
        stats.words.push_back(static_cast<std::uint32_t>(w));
    }
  }

  // The best pair first: the highest count, then the smallest (left, right). An entry's count
  // is the pair's when it was pushed; a pair's count only falls after that (every pair a merge
  // creates holds the new token, so it is new), so an entry whose count is still the pair's is
  // the true best, and one whose count is stale goes back with the current count.
  struct Candidate {
    std::uint64_t count;
    std::int32_t left, right;
    std::size_t index;
    bool operator<(const Candidate& other) const {  // "less urgent than"
      if (count != other.count) return count < other.count;
      return std::pair(left, right) > std::pair(other.left, other.right);
    }
  };
  std::priority_queue<Candidate> heap;
  for (std::size_t i = 0; i < pairs.size(); ++i)
    heap.push({pairs[i].count, pairs[i].left, pairs[i].right, i});

  const std::uint64_t min_count = std::max<std::uint64_t>(options_.min_frequency, 1);
  std::vector<std::size_t> touched;  // pairs holding the new token, to push once the merge is done
  std::vector<bool> is_touched;
  while (out.merges.size() < options_.merges && !heap.empty()) {
    const Candidate best = heap.top();
    heap.pop();
    const std::uint64_t count = pairs[best.index].count;
    if (count != best.count) {
      if (count > 0) heap.push({count, best.left, best.right, best.index});
      continue;
    }
    if (count < min_count) break;

    const std::int32_t left = best.left, right = best.right;
    std::string joined =
        out.tokens[static_cast<std::size_t>(left)] + out.tokens[static_cast<std::size_t>(right)];
    // Two merges can spell one token ("a" + "bc", "ab" + "c"); like Hugging Face, the second
    // reuses the first's id. Its pairs may then exist already: counts can rise, which the heap
    // absorbs with a fresh entry per rising pair.
    const auto new_id = static_cast<std::int32_t>(out.tokens.size());
    const std::optional<std::int32_t> existing = token_ids.insert(joined, new_id);
    const std::int32_t id = existing ? *existing : new_id;
    if (!existing) out.tokens.push_back(std::move(joined));
    out.merges.push_back({left, right, id, count});

    // The words list is taken: the pair is gone from every word once this merge is done (a
    // left-to-right pass leaves no adjacent left, right behind), so nothing reads it again.
    const std::vector<std::uint32_t> candidates = std::move(pairs[best.index].words);
    pairs[best.index].words = {};
    for (const std::uint32_t w : candidates) {
      Word& word = words[w];
      std::int32_t* s = symbols.data() + word.begin;
      const std::uint32_t n = word.length;
      bool holds = false;
      for (std::uint32_t i = 0; i + 1 < n && !holds; ++i) holds = s[i] == left && s[i + 1] == right;
      if (!holds) continue;
      // Rewriting the whole word's pairs (out with the old, in with the new) is simpler than
      // tracking each merge site's neighbours, and words are short.
      for (std::uint32_t i = 0; i + 1 < n; ++i) pairs[index_of(s[i], s[i + 1])].count -= word.count;
      std::uint32_t kept = 0;
      for (std::uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == left && s[i + 1] == right) {
          s[kept++] = id;
          i += 2;
        } else {
          s[kept++] = s[i++];
        }
      }
      word.length = kept;
      for (std::uint32_t i = 0; i + 1 < kept; ++i) {
        const std::size_t p = index_of(s[i], s[i + 1]);
        pairs[p].count += word.count;
        if (s[i] != id && s[i + 1] != id) continue;
        if (pairs[p].words.empty() || pairs[p].words.back() != w) pairs[p].words.push_back(w);
        if (is_touched.size() < pairs.size()) is_touched.resize(pairs.size() * 2, false);
        if (!is_touched[p]) {
          is_touched[p] = true;
          touched.push_back(p);
        }
      }
    }
    for (const std::size_t p : touched) {
      if (pairs[p].count > 0) heap.push({pairs[p].count, pairs[p].left, pairs[p].right, p});
      is_touched[p] = false;
    }
    touched.clear();
  }

  for (std::size_t i = 0; i < out.special_tokens.size(); ++i) {
    const auto bytes = from_byte_level(out.special_tokens[i]);
    if (!bytes) continue;
    if (const std::int32_t id = token_ids.find(*bytes); id >= 0) {
      throw ConfigError(concat("BpeTrainerOptions::special_tokens[", i, "] \"",
                               out.special_tokens[i], "\" is spelled like token ", id,
                               " in the byte-level alphabet: tokenizer.json cannot hold both"));
    }
  }
  return out;
}

inline std::string TrainedBpe::to_tokenizer_json() const {
  // Written line by line rather than as one nlohmann::json value: its objects are sorted maps
  // (the vocabulary would come out in string order, not id order) or, ordered, slow to build
  // (a linear search per key). nlohmann still spells every string.
  const auto quote = [](std::string_view s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  };
  std::vector<std::string> spelled;
  spelled.reserve(tokens.size());
  for (const std::string& token : tokens) spelled.push_back(quote(to_byte_level(token)));

  std::string out;
  out.reserve(tokens.size() * 24 + merges.size() * 24 + 1024);
  out += R"({
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [)";
  for (std::size_t i = 0; i < special_tokens.size(); ++i) {
    out += concat(i ? "," : "", "\n    {\n      \"id\": ", tokens.size() + i,
                  ",\n      \"content\": ", quote(special_tokens[i]), ",", R"(
      "single_word": false,
      "lstrip": false,
      "rstrip": false,
      "normalized": false,
      "special": true
    })");
  }
  out += special_tokens.empty() ? "],\n" : "\n  ],\n";
  out += R"(  "normalizer": null,
  "pre_tokenizer": {
    "type": "ByteLevel",
    "add_prefix_space": false,
    "trim_offsets": true,
    "use_regex": true
  },
  "post_processor": {
    "type": "ByteLevel",
    "add_prefix_space": true,
    "trim_offsets": false,
    "use_regex": true
  },
  "decoder": {
    "type": "ByteLevel",
    "add_prefix_space": true,
    "trim_offsets": true,
    "use_regex": true
  },
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": null,
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": false,
    "byte_fallback": false,
    "ignore_merges": false,
    "vocab": {)";
  // The special tokens are in the vocabulary too, as Hugging Face's trainer and GPT-2's file
  // have them, so that the model alone knows every id.
  const std::size_t entries = tokens.size() + special_tokens.size();
  for (std::size_t id = 0; id < entries; ++id) {
    out += id ? ",\n      " : "\n      ";
    out += id < tokens.size() ? spelled[id] : quote(special_tokens[id - tokens.size()]);
    out += concat(": ", id);
  }
  out += "\n    },\n";  // never empty: the 256 bytes are tokens
  out += "    \"merges\": [";
  for (std::size_t i = 0; i < merges.size(); ++i) {
    out += i ? ",\n      [" : "\n      [";
    out += spelled[static_cast<std::size_t>(merges[i].left)];
    out += ", ";
    out += spelled[static_cast<std::size_t>(merges[i].right)];
    out += ']';
  }
  out += merges.empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n";
  return out;
}

}  // namespace dissect::text
