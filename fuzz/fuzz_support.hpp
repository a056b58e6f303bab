// fuzz/fuzz_support.hpp — what the libFuzzer harnesses share: the tiny model every harness
// loads into, a scratch directory of their own, and the one rule of what a harness may swallow.
//
// The rule: dissect documents that a bad file is a dissect::Error (FormatError, ConfigError,
// ShapeError, OverflowError, …). A harness catches exactly that. Anything else — another
// exception type (nlohmann::json's, std::out_of_range, std::bad_alloc from a size the file
// made up), a crash, a sanitizer report, a violated invariant — escapes to libFuzzer, which
// reports it and keeps the input.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"

namespace dissect::fuzz {

/// GPT-2's parts at their smallest (D = 8, L = 1, H = 2, F = 16, V = 11, context 4): the model
/// the harnesses load files into, and the one the seed corpus is written from (make_corpus).
inline TransformerConfig tiny_gpt2() {
  return {.d_model = 8, .n_layers = 1, .n_heads = 2, .d_ff = 16, .vocab = 11, .context = 4};
}

/// LLaMA's parts, every in_features a multiple of q4_0's 32 (D = 32, L = 1, H = 4, H_kv = 2,
/// F = 32, V = 11, context 4): the quantised seeds.
inline TransformerConfig tiny_llama() {
  return {.d_model = 32,
          .n_layers = 1,
          .n_heads = 4,
          .n_kv_heads = 2,
          .d_ff = 32,
          .vocab = 11,
          .context = 4,
          .tied_embeddings = false,
          .positions = Positions::rotary,
          .norm = Norm::rms_norm,
          .bias = false,
          .ffn = Ffn::gated};
}

/// tiny_gpt2 as Hugging Face's config.json says it.
inline constexpr std::string_view tiny_gpt2_config_json =
    R"({"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "n_inner": 16,)"
    R"( "vocab_size": 11, "n_positions": 4})";

/// A directory of this process's own under $TMPDIR (libFuzzer's -fork and -jobs run several
/// processes at once), made on first use and removed at exit.
inline const std::filesystem::path& scratch_directory() {
  static const std::filesystem::path dir = [] {
    const auto path = std::filesystem::temp_directory_path() /
                      ("dissect-fuzz-" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_directory(), ignored);
    });
    return path;
  }();
  return dir;
}

/// Writes `size` bytes at `data` to `path`, replacing it. Aborts if it cannot: a harness that
/// cannot write its input would fuzz nothing.
inline void write_file(const std::filesystem::path& path, const std::uint8_t* data,
                       std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

/// The input as owned bytes, for the readers that take a file's bytes in memory.
inline std::vector<std::byte> bytes_of(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  return bytes;
}

/// Up to 64 token ids read from the input's bytes (two a id), in [0, vocab_size + 2): some of
/// them past the vocabulary, which a decoder must refuse.
inline std::vector<std::int32_t> ids_of(const std::uint8_t* data, std::size_t size,
                                        std::size_t vocab_size) {
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i + 1 < size && ids.size() < 64; i += 2) {
    ids.push_back(static_cast<std::int32_t>(data[i] | (data[i + 1] << 8)) %
                  static_cast<std::int32_t>(vocab_size + 2));
  }
  return ids;
}

/// A harness's own consistency check: a failure is a bug libFuzzer must report.
inline void require(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz: invariant violated: %s\n", what);
    std::abort();
  }
}

/// Runs `f`, swallowing only dissect's documented errors.
template <class F>
void expect_only_dissect_errors(F&& f) {
  try {
    f();
  } catch (const Error&) {
    // a refused input: what dissect promises for a bad file
  }
}

}  // namespace dissect::fuzz
