// tests/support/tokenizer_fixtures.hpp — reading tests/reference/tokenizers/: its JSON-lines
// corpora and decoded texts, its .ids files (one case a line, space-separated ids), and the
// vocabularies scripts/install-tokenizers puts in DISSECT_TOKENIZER_PACKAGES.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dissect::testing {

/// tests/reference/tokenizers.
inline std::filesystem::path tokenizer_references() {
  return std::filesystem::path(DISSECT_FIXTURE_DIR).parent_path() / "tokenizers";
}

/// The lines of a file. @throws std::runtime_error naming it (and the script that makes it).
inline std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path.string() + " (run scripts/install-tokenizers)");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// One JSON string a line.
inline std::vector<std::string> read_jsonl(const std::filesystem::path& path) {
  std::vector<std::string> out;
  for (const auto& line : read_lines(path))
    out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

/// One case a line, its ids space-separated (an empty line: no ids).
inline std::vector<std::vector<std::int32_t>> read_ids(const std::filesystem::path& path) {
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& line : read_lines(path)) {
    std::vector<std::int32_t> ids;
    std::size_t at = 0;
    while (at < line.size()) {
      std::size_t end = line.find(' ', at);
      if (end == std::string::npos) end = line.size();
      ids.push_back(std::stoi(line.substr(at, end - at)));
      at = end + 1;
    }
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace dissect::testing
