// Reader for the PyTorch reference fixtures in tests/reference/fixtures (written by
// tests/reference/generate_fixtures.py; the format is in tests/reference/README.md).
//
// Standard library only, and independent of every dissect header, so a broken Tensor or shape
// type can never make the reference data itself unreadable. Tests convert FixtureTensor into
// whatever they compare against.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace dissect::testing {

/// One tensor of a fixture: its shape and its values, row-major.
///
/// Values are doubles whatever the fixture's dtype, and hold exactly what PyTorch held. A
/// float32 value is printed with 9 significant digits; strtod returns the double nearest to that
/// decimal, which is not the float itself but rounds to exactly it, so the reader stores
/// static_cast<float>(parsed). Then static_cast<float>(value) reproduces PyTorch's bits, and
/// arithmetic in double on the values starts from PyTorch's inputs, not from a decimal near them.
struct FixtureTensor {
  std::vector<std::int64_t> shape;
  std::vector<double> values;

  std::int64_t rank() const { return static_cast<std::int64_t>(shape.size()); }
  std::int64_t numel() const { return static_cast<std::int64_t>(values.size()); }
};

/// One parsed fixture file.
struct Fixture {
  std::filesystem::path path;
  std::string case_name;
  std::string dtype;  // "float32" or "float64"
  std::map<std::string, std::string> meta;
  std::map<std::string, FixtureTensor> tensors;

  bool has(const std::string& name) const { return tensors.count(name) != 0; }

  const FixtureTensor& tensor(const std::string& name) const {
    const auto it = tensors.find(name);
    if (it == tensors.end()) fail("has no tensor '" + name + "'");
    return it->second;
  }

  bool has_meta(const std::string& key) const { return meta.count(key) != 0; }

  const std::string& meta_str(const std::string& key) const {
    const auto it = meta.find(key);
    if (it == meta.end()) fail("has no meta '" + key + "'");
    return it->second;
  }

  std::int64_t meta_int(const std::string& key) const {
    const std::string& text = meta_str(key);
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      fail("meta '" + key + "' is '" + text + "', not an integer");
    }
    return value;
  }

  bool meta_bool(const std::string& key) const { return meta_int(key) != 0; }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("fixture " + path.string() + " (case " + case_name + ") " + what);
  }
};

namespace fixture_detail {

// Splits the file into whitespace-separated words, remembering each word's line so errors can
// point at it. Whole-line comments (first non-blank character '#') and blank lines vanish.
struct Word {
  std::string text;
  std::size_t line;
  bool starts_line;
};

inline std::vector<Word> split_words(std::istream& in, std::size_t& line_count) {
  std::vector<Word> words;
  std::string line;
  line_count = 0;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    line_count = number;
    const auto first = line.find_first_not_of(" \t\r\v\f");
    if (first == std::string::npos || line[first] == '#') continue;
    std::istringstream fields(line);
    bool first_on_line = true;
    for (std::string text; fields >> text; first_on_line = false) {
      words.push_back({std::move(text), number, first_on_line});
    }
  }
  return words;
}

class Parser {
 public:
  Parser(std::filesystem::path path, std::vector<Word> words, std::size_t line_count)
      : path_(std::move(path)), words_(std::move(words)), line_count_(line_count) {}

  Fixture parse() {
    Fixture fixture;
    fixture.path = path_;
    fixture.case_name = keyword_value("case");
    fixture.dtype = keyword_value("dtype");
    bool ended = false;
    while (!ended) {
      const Word& word = next("'meta', 'tensor' or 'end'");
      if (!word.starts_line) fail(word, "a keyword at the start of a line", "'" + word.text + "'");
      if (word.text == "meta") {
        const Word& key = next_on_line(word, "a meta key");
        const Word& value = next_on_line(word, "a value for meta '" + key.text + "'");
        if (!fixture.meta.emplace(key.text, value.text).second) {
          fail(key, "each meta key once", "a second '" + key.text + "'");
        }
      } else if (word.text == "tensor") {
        parse_tensor(word, fixture);
      } else if (word.text == "end") {
        ended = true;
      } else {
        fail(word, "'meta', 'tensor' or 'end'", "'" + word.text + "'");
      }
      end_of_line(word);
    }
    if (pos_ < words_.size())
      fail(words_[pos_], "nothing after 'end'", "'" + words_[pos_].text + "'");
    return fixture;
  }

 private:
  void parse_tensor(const Word& keyword, Fixture& fixture) {
    const Word& name = next_on_line(keyword, "a tensor name");
    if (fixture.tensors.count(name.text) != 0) {
      fail(name, "each tensor name once", "a second '" + name.text + "'");
    }
    const Word& rank_word = next_on_line(keyword, "the rank of tensor '" + name.text + "'");
    const std::int64_t rank = to_int(rank_word, "the rank of tensor '" + name.text + "'");
    FixtureTensor tensor;
    // Counted in int64 with an overflow check, so a corrupt dimension becomes an error message
    // instead of a huge allocation.
    std::int64_t count = 1;
    for (std::int64_t axis = 0; axis < rank; ++axis) {
      const std::string what =
          "dimension " + std::to_string(axis) + " of tensor '" + name.text + "'";
      const Word& dim_word = next_on_line(keyword, what + " (rank " + std::to_string(rank) + ")");
      const std::int64_t dim = to_int(dim_word, what);
      if (dim != 0 && count > std::numeric_limits<std::int64_t>::max() / dim) {
        fail(dim_word, "an element count that fits in int64", "overflow");
      }
      count *= dim;
      tensor.shape.push_back(dim);
    }
    end_of_line(keyword);
    const auto remaining = static_cast<std::int64_t>(words_.size() - pos_);
    if (count > remaining) {
      const std::string what = std::to_string(count) + " values for tensor '" + name.text + "'";
      if (remaining == 0) fail_eof(what);
      fail(words_[pos_], what, "only " + std::to_string(remaining) + " words left in the file");
    }
    const bool is_float32 = fixture.dtype == "float32";
    tensor.values.reserve(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      const Word& value = words_[pos_++];
      const double parsed =
          to_double(value, "value " + std::to_string(i) + " of tensor '" + name.text + "' (" +
                               std::to_string(count) + " expected)");
      tensor.values.push_back(is_float32 ? static_cast<double>(static_cast<float>(parsed))
                                         : parsed);
    }
    fixture.tensors.emplace(name.text, std::move(tensor));
  }

  std::string keyword_value(const std::string& keyword) {
    const Word& word = next("'" + keyword + "'");
    if (!word.starts_line || word.text != keyword) {
      fail(word, "'" + keyword + "' at the start of a line", "'" + word.text + "'");
    }
    std::string value = next_on_line(word, "a value after '" + keyword + "'").text;
    end_of_line(word);
    return value;
  }

  const Word& next(const std::string& expected) {
    if (pos_ == words_.size()) fail_eof(expected);
    return words_[pos_++];
  }

  // The next word, which must be on the same line as `head`.
  const Word& next_on_line(const Word& head, const std::string& expected) {
    if (pos_ == words_.size() || words_[pos_].line != head.line) {
      fail_at(head.line, expected, "end of line");
    }
    return words_[pos_++];
  }

  // Nothing else may follow on the line of `head`: a stray word means the header is not what
  // the writer intended (e.g. a rank that disagrees with the number of dimensions).
  void end_of_line(const Word& head) {
    if (pos_ < words_.size() && words_[pos_].line == head.line) {
      fail(words_[pos_], "end of line after '" + head.text + "'", "'" + words_[pos_].text + "'");
    }
  }

  std::int64_t to_int(const Word& word, const std::string& what) {
    std::int64_t value = 0;
    const char* begin = word.text.data();
    const char* end = begin + word.text.size();
    const auto [stop, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || stop != end || value < 0) {
      fail(word, what + " as a non-negative integer", "'" + word.text + "'");
    }
    return value;
  }

  // strtod reads the locale's decimal point; tests never call setlocale, so it is the "C"
  // locale's '.', which is what the generator prints.
  double to_double(const Word& word, const std::string& what) {
    const char* begin = word.text.c_str();
    char* stop = nullptr;
    const double value = std::strtod(begin, &stop);
    if (stop == begin || *stop != '\0') fail(word, what + " as a number", "'" + word.text + "'");
    return value;
  }

  [[noreturn]] void fail(const Word& word, const std::string& expected, const std::string& got) {
    fail_at(word.line, expected, got);
  }

  [[noreturn]] void fail_eof(const std::string& expected) {
    fail_at(line_count_, expected, "end of file");
  }

  [[noreturn]] void fail_at(std::size_t line, const std::string& expected, const std::string& got) {
    throw std::runtime_error(path_.string() + ":" + std::to_string(line) + ": expected " +
                             expected + ", got " + got);
  }

  std::filesystem::path path_;
  std::vector<Word> words_;
  std::size_t line_count_;
  std::size_t pos_ = 0;
};

}  // namespace fixture_detail

/// Parses one fixture file. Throws std::runtime_error naming the file, the line and what was
/// expected there.
inline Fixture read_fixture(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open fixture " + path.string());
  std::size_t line_count = 0;
  std::vector<fixture_detail::Word> words = fixture_detail::split_words(in, line_count);
  if (in.bad()) throw std::runtime_error("error reading fixture " + path.string());
  return fixture_detail::Parser(path, std::move(words), line_count).parse();
}

/// Every *.txt fixture directly in `dir`, sorted so test order (and failure output) is stable.
/// Throws if the directory is missing or holds no fixture: an empty list would let a
/// parameterised test pass without testing anything.
inline std::vector<std::filesystem::path> list_fixtures(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw std::runtime_error("fixture directory " + dir.string() + " does not exist");
  }
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt")
      paths.push_back(entry.path());
  }
  if (paths.empty()) throw std::runtime_error("no *.txt fixtures in " + dir.string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

#ifdef DISSECT_FIXTURE_DIR
/// The fixture directory of one block, e.g. fixture_dir("linear").
inline std::filesystem::path fixture_dir(const std::string& block) {
  return std::filesystem::path(DISSECT_FIXTURE_DIR) / block;
}
#endif

}  // namespace dissect::testing
