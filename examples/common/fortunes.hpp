// examples/common/fortunes.hpp — the English fortunes of Debian's `fortunes` package as one
// text, the corpus train_gpt trains on and quantize_gpt evaluates on: every plain fortune file of
// a directory in name order, joined, the "%" lines that separate fortunes kept.
//
// NOT part of the dissect library: example-only.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/common/byte_vocab.hpp"

namespace dissect::examples {

inline constexpr const char* kDefaultFortunes = "/usr/share/games/fortunes";
inline constexpr const char* kFortunesPackage = "fortunes";

/// The data directory is missing or holds no fortune file: the install hint follows.
struct DataMissing : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// A fortune file that cannot be read: bad input too (exit status 2).
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The corpus: the joined text, the files it came from, and its vocabulary.
struct Corpus {
  std::string text;
  std::vector<std::string> files;
  dissect::tools::ByteVocab vocab;  ///< the text's distinct bytes, ascending
};

/// Reads the fortune files of `dir` as the header says. @throws DataMissing, or DataError
/// naming a file that cannot be read.
inline Corpus read_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataMissing(dir + " is not a directory");
  Corpus corpus;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    // Regular files only: the .u8 names are symlinks to the plain files, off/ is a directory.
    if (!entry.is_regular_file() || entry.is_symlink()) continue;
    if (name.ends_with(".dat") || name.ends_with(".u8") || name.starts_with(".")) continue;
    corpus.files.push_back(name);
  }
  std::sort(corpus.files.begin(), corpus.files.end());
  if (corpus.files.empty()) throw DataMissing("no fortune file in " + dir);
  for (const std::string& name : corpus.files) {
    const fs::path path = fs::path(dir) / name;
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) throw DataError("cannot read " + path.string());
    if (bytes.empty()) continue;
    if (bytes.back() != '\n') bytes += '\n';
    if (!bytes.ends_with("\n%\n") && bytes != "%\n") bytes += "%\n";
    corpus.text += bytes;
  }
  corpus.vocab = dissect::tools::ByteVocab::of_text(corpus.text);
  return corpus;
}

}  // namespace dissect::examples
