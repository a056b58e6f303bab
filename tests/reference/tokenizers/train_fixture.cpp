// Trains the BPE fixture of tests/test_bpe_trainer.cpp: 500 merges on corpus/fortunes.jsonl
// with <|endoftext|> as a special token, written to trained/fortunes-500.tokenizer.json, which
// make_trainer_fixture.mjs then encodes with transformers.js. From the repository's root:
//
//   g++ -std=c++20 -O2 -Iinclude tests/reference/tokenizers/train_fixture.cpp -o /tmp/train_fixture
//   \
//       -lpcre2-8 -lutf8proc
//   /tmp/train_fixture
//
// The options must stay those of fixture_options() in tests/test_bpe_trainer.cpp.
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "dissect/text/bpe_trainer.hpp"
#include "dissect/text/tokenizer_files.hpp"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path here = argc > 1 ? fs::path(argv[1]) : fs::path("tests/reference/tokenizers");
  try {
    std::vector<std::string> texts;
    std::size_t bytes = 0;
    std::ifstream in(here / "corpus" / "fortunes.jsonl", std::ios::binary);
    if (!in)
      throw std::runtime_error("cannot read " + (here / "corpus" / "fortunes.jsonl").string());
    for (std::string line; std::getline(in, line);) {
      texts.push_back(nlohmann::json::parse(line).get<std::string>());
      bytes += texts.back().size();
    }
    const auto start = std::chrono::steady_clock::now();
    const dissect::text::TrainedBpe bpe = dissect::text::train_bpe(
        std::span<const std::string>(texts),
        {.merges = 500, .min_frequency = 2, .special_tokens = {"<|endoftext|>"}});
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string json = bpe.to_tokenizer_json();
    (void)bpe.to_tokenizer();  // it must load

    fs::create_directories(here / "trained");
    const fs::path out_path = here / "trained" / "fortunes-500.tokenizer.json";
    std::ofstream out(out_path, std::ios::binary);
    out << json;
    out.close();
    if (!out) throw std::runtime_error("cannot write " + out_path.string());
    std::printf(
        "%zu texts, %zu bytes, %llu words (%zu distinct): %zu merges in %.3f s, vocabulary %zu -> "
        "%s\n",
        texts.size(), bytes, static_cast<unsigned long long>(bpe.words), bpe.distinct_words,
        bpe.merges.size(), seconds, bpe.vocab_size(), out_path.string().c_str());
  } catch (const std::exception& e) {
    std::cerr << "train_fixture: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
