// Tests for dissect/io/gguf_weights.hpp against llama.cpp itself. The f32 models are made at
// test time (tests/support/gguf_models.hpp: the same bytes every run); the quantised ones are
// llama.cpp's own llama_model_quantize of them, committed; logits.json holds llama.cpp's logits
// for a fixed prompt on each file and its greedy continuation (make_fixtures.sh wrote both).
// dissect must load each file, give llama.cpp's logits within the stated bound and the same
// greedy tokens, and quantise the f32 weights to exactly llama.cpp's bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_quantize.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "support/gguf_models.hpp"
#include "support/io_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_gguf_models {

using testing::TemporaryDirectory;

const std::filesystem::path fixtures(DISSECT_GGUF_FIXTURE_DIR);

const nlohmann::json& reference() {
  static const nlohmann::json json = [] {
    std::ifstream in(fixtures / "logits.json");
    return nlohmann::json::parse(in);
  }();
  return json;
}

/// The model file `name` of the reference: committed, or (the f32 ones) made here.
struct ModelFile {
  TemporaryDirectory directory;
  std::filesystem::path path;
  explicit ModelFile(const std::string& name) {
    if (name.ends_with("_f32.gguf")) {
      path = directory / name;
      testing::write_random_gguf_model(
          path, name.starts_with("llama") ? ModelFamily::llama : ModelFamily::gpt2, GgmlType::f32);
    } else {
      path = fixtures / name;
    }
  }
};

template <class Model>
Tensor<float, 3> logits_of(const GgufFile& file, const std::vector<index_t>& prompt,
                           GgufLoadOptions options) {
  const Model model = load_gguf_model<Model>(file, options);
  return model.forward(TokenBatch{prompt, 1, static_cast<index_t>(prompt.size())});
}

index_t argmax(const float* row, index_t n) {
  return static_cast<index_t>(std::max_element(row, row + n) - row);
}

/// The largest |dissect − llama.cpp| over every position and token, relative to the largest
/// |logit| llama.cpp gave; and whether each position's argmax agrees.
struct Agreement {
  double max_error = 0, scale = 0;
  int argmax_disagreements = 0;
};

Agreement compare(const Tensor<float, 3>& ours, const nlohmann::json& theirs) {
  Agreement result;
  const index_t vocab = ours.dim(2);
  for (index_t t = 0; t < ours.dim(1); ++t) {
    const auto& row = theirs[static_cast<std::size_t>(t)];
    EXPECT_EQ(static_cast<index_t>(row.size()), vocab);
    std::vector<float> reference_row(row.begin(), row.end());
    const float* our_row = ours.data() + t * vocab;
    for (index_t v = 0; v < vocab; ++v) {
      result.max_error = std::max(
          result.max_error,
          std::fabs(double(our_row[v]) - double(reference_row[static_cast<std::size_t>(v)])));
      result.scale =
          std::max(result.scale, std::fabs(double(reference_row[static_cast<std::size_t>(v)])));
    }
    result.argmax_disagreements += argmax(our_row, vocab) != argmax(reference_row.data(), vocab);
  }
  return result;
}

template <class Model>
std::vector<index_t> greedy(const GgufFile& file, std::vector<index_t> ids, int steps) {
  const Model model = load_gguf_model<Model>(file);
  std::vector<index_t> chosen;
  for (int s = 0; s < steps; ++s) {
    const Tensor<float, 3> logits =
        model.forward(TokenBatch{ids, 1, static_cast<index_t>(ids.size())});
    const index_t vocab = logits.dim(2);
    const index_t next = argmax(logits.data() + (logits.dim(1) - 1) * vocab, vocab);
    chosen.push_back(next);
    ids.push_back(next);
  }
  return chosen;
}

struct Case {
  std::string file;
  double bound;        ///< on max |Δlogit| / max |logit|, the blocks kept (llama.cpp's arithmetic)
  double float_bound;  ///< the same with every weight dequantised to float
};

class GgufModelsAgainstLlamaCpp : public ::testing::TestWithParam<Case> {};

TEST_P(GgufModelsAgainstLlamaCpp, LogitsAndGreedyTokensMatch) {
  const Case& c = GetParam();
  const nlohmann::json& expected = reference()["models"][c.file];
  ASSERT_FALSE(expected.is_null()) << c.file << " is not in logits.json";
  const std::vector<index_t> prompt = reference()["prompt"].get<std::vector<index_t>>();
  const ModelFile model(c.file);
  const GgufFile file(model.path);
  const bool llama = c.file.starts_with("llama");
  for (const bool keep : {true, false}) {
    GgufLoadOptions options;
    options.keep_quantized = keep;
    const Tensor<float, 3> logits = llama ? logits_of<LlamaModel<float>>(file, prompt, options)
                                          : logits_of<GPT2Model<float>>(file, prompt, options);
    const Agreement agreement = compare(logits, expected["logits"]);
    const double bound = keep ? c.bound : c.float_bound;
    EXPECT_LE(agreement.max_error, bound * agreement.scale)
        << c.file << (keep ? " (blocks kept)" : " (float)") << ": max |Δ| " << agreement.max_error
        << " of logits up to " << agreement.scale;
    EXPECT_EQ(agreement.argmax_disagreements, 0) << c.file;
  }
  const auto steps = static_cast<int>(expected["greedy"].size());
  const std::vector<index_t> tokens = llama ? greedy<LlamaModel<float>>(file, prompt, steps)
                                            : greedy<GPT2Model<float>>(file, prompt, steps);
  EXPECT_EQ(tokens, expected["greedy"].get<std::vector<index_t>>()) << c.file;
}

// Measured (max |Δlogit| / max |logit|, make_fixtures.sh's run): llama f32 7.6e-7, gpt2 f32
// 1.1e-4. f32 LLaMA differs only in summation order (llama.cpp's SIMD dot products against
// dissect's GEMM), a few float ulps. GPT-2 more: ggml computes GELU from a table indexed by the
// input rounded to fp16 (2⁻¹¹ relative), dissect from the input itself.
// The quantised files with their blocks kept run llama.cpp's own arithmetic: every activation
// rounded to q8_0 (q8_K for the K-quants) and integer dot products against the blocks
// (quant/detail/ggml_dot.hpp). llama q8_0 then agrees exactly (0) and llama q4_K_M to 2.5e-7;
// gpt2 q8_0 stays at 6.1e-3, because the fp16 GELU table moves some activations across a q8_0
// rounding boundary, one step of 127 in that block. With every weight dequantised to float
// instead, llama q8_0 1.3e-2, llama q4_K_M 1.9e-2, gpt2 q8_0 6.5e-3: dissect's float activations
// against llama.cpp's rounded ones, through two layers. The bounds leave 2× to 10×.
INSTANTIATE_TEST_SUITE_P(Files, GgufModelsAgainstLlamaCpp,
                         ::testing::Values(Case{"llama_f32.gguf", 1e-5, 1e-5},
                                           Case{"gpt2_f32.gguf", 5e-4, 5e-4},
                                           Case{"llama_q8_0.gguf", 1e-6, 3e-2},
                                           Case{"llama_q4_k_m.gguf", 4e-6, 4e-2},
                                           Case{"gpt2_q8_0.gguf", 1.5e-2, 2e-2}),
                         [](const auto& info) {
                           std::string name = info.param.file.substr(0, info.param.file.size() - 5);
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

TEST(GgufModels, LlamaCppsQuantisedBytesAreDissectsQuantisationOfTheF32Weights) {
  // The committed files are llama_model_quantize's output for the f32 model made here: every
  // tensor's bytes must be dissect's quantize_ggml of the f32 tensor, in the type llama.cpp chose.
  for (const std::string name : {"llama_q8_0.gguf", "llama_q4_k_m.gguf", "gpt2_q8_0.gguf"}) {
    const ModelFile f32(name.starts_with("llama") ? "llama_f32.gguf" : "gpt2_f32.gguf");
    const GgufFile source(f32.path);
    const GgufFile quantised(fixtures / name);
    ASSERT_EQ(quantised.tensors().size(), source.tensors().size()) << name;
    for (const GgufTensorInfo& info : quantised.tensors()) {
      const std::vector<float> values = source.dequantize(info.name);
      const std::vector<std::byte> ours = quantize_ggml(info.type, values);
      const std::span<const std::byte> theirs = quantised.bytes(info.name);
      ASSERT_EQ(ours.size(), theirs.size()) << name << " " << info.name;
      EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), ours.size()), 0)
          << name << ": " << info.name << " (" << ggml_type_name(info.type) << ")";
    }
  }
}

// ---- quantize_gguf: llama_model_quantize's files, byte for byte ------------------------------

std::uint64_t fnv1a64(const std::vector<std::byte>& bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const std::byte b : bytes) hash = (hash ^ static_cast<std::uint8_t>(b)) * 0x100000001b3ull;
  return hash;
}

std::string hex(std::uint64_t value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) text[static_cast<std::size_t>(i)] = digits[value & 15];
  return text;
}

/// dissect's quantize_gguf of the f32 model of `family` by `recipe`, as bytes.
std::vector<std::byte> quantized_by_dissect(const std::string& family, GgufRecipe recipe) {
  const ModelFile f32(family + "_f32.gguf");
  TemporaryDirectory directory;
  quantize_gguf(GgufFile(f32.path), directory / "out.gguf", recipe);
  return testing::read_file(directory / "out.gguf");
}

TEST(GgufQuantize, GivesLlamaCppsCommittedFilesByteForByte) {
  EXPECT_EQ(quantized_by_dissect("llama", GgufRecipe::q8_0),
            testing::read_file(fixtures / "llama_q8_0.gguf"));
  EXPECT_EQ(quantized_by_dissect("llama", GgufRecipe::q4_k_m),
            testing::read_file(fixtures / "llama_q4_k_m.gguf"));
  EXPECT_EQ(quantized_by_dissect("gpt2", GgufRecipe::q8_0),
            testing::read_file(fixtures / "gpt2_q8_0.gguf"));
}

TEST(GgufQuantize, GivesLlamaCppsOtherRecipesByDigest) {
  std::ifstream in(fixtures / "quantized_digests.json");
  const nlohmann::json digests = nlohmann::json::parse(in)["files"];
  ASSERT_EQ(digests.size(), 5u);
  for (const auto& [file, expected] : digests.items()) {
    const std::string family = file.substr(0, file.find('_'));
    const std::string recipe = file.substr(family.size() + 1, file.size() - family.size() - 6);
    const std::vector<std::byte> bytes =
        quantized_by_dissect(family, gguf_recipe_from_name(recipe));
    EXPECT_EQ(bytes.size(), expected["bytes"].get<std::size_t>()) << file;
    EXPECT_EQ(hex(fnv1a64(bytes)), expected["fnv1a64"].get<std::string>()) << file;
  }
}

TEST(GgufQuantize, RefusesWhatLlamaCppWouldNotReproduce) {
  TemporaryDirectory directory;
  try {
    quantize_gguf(GgufFile(fixtures / "llama_q8_0.gguf"), directory / "again.gguf",
                  GgufRecipe::q4_k_m);
    FAIL() << "no throw";
  } catch (const Error& error) {
    EXPECT_TRUE(testing::contains(error.what(), "is already q8_0"));
  }
  EXPECT_FALSE(std::filesystem::exists(directory / "again.gguf"));
  EXPECT_EQ(gguf_recipe_from_name("Q4_K_M"), GgufRecipe::q4_k_m);
  EXPECT_THROW(gguf_recipe_from_name("q3_k_xl"), ConfigError);
  EXPECT_TRUE(detail::use_more_bits(1, 2));
  EXPECT_FALSE(detail::use_more_bits(0, 2));
  // LLaMA-7B's 32 layers: 0–3, 28–31 and every third from 6.
  std::vector<index_t> more;
  for (index_t layer = 0; layer < 32; ++layer) {
    if (detail::use_more_bits(layer, 32)) more.push_back(layer);
  }
  EXPECT_EQ(more, (std::vector<index_t>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
}

TEST(GgufModels, RotaryRowsGoBackToHuggingFacesOrder) {
  // llama.cpp's converter: w.reshape(H, 2, d_k/2, in).swapaxes(1, 2): file row h·d_k + 2i + j
  // holds Hugging Face row h·d_k + j·d_k/2 + i. Apply it to row numbers and undo it.
  const index_t heads = 3, dk = 8;
  std::vector<index_t> file_rows(static_cast<std::size_t>(heads * dk));
  for (index_t h = 0; h < heads; ++h) {
    for (index_t j = 0; j < 2; ++j) {
      for (index_t i = 0; i < dk / 2; ++i) {
        file_rows[static_cast<std::size_t>(h * dk + 2 * i + j)] = h * dk + j * dk / 2 + i;
      }
    }
  }
  for (index_t r = 0; r < heads * dk; ++r) {
    EXPECT_EQ(file_rows[static_cast<std::size_t>(detail::gguf_rotary_source_row(r, dk))], r);
  }
}

TEST(GgufModels, Tq2_0TensorsKeepTheirBlocksAndABadCodeNamesTheTensor) {
  // A BitNet b1.58 file stores its matrices as tq2_0: every Linear keeps those blocks and runs
  // llama.cpp's arithmetic on them (quant/detail/ggml_dot.hpp), within the activations' q8_K
  // rounding of the same model run in float on the dequantised weights.
  TemporaryDirectory directory;
  const auto path = directory / "llama_tq2_0.gguf";
  testing::write_random_gguf_model(path, ModelFamily::llama, GgmlType::tq2_0);
  const GgufFile file(path);
  EXPECT_EQ(file.info("blk.0.ffn_down.weight").type, GgmlType::tq2_0);
  auto kept = load_gguf_model<LlamaModel<float>>(file);
  int layers = 0;
  for_each_layer(kept, [&](const std::string& name, Linear<float>& layer) {
    ASSERT_TRUE(layer.quantized()) << name;
    EXPECT_EQ(layer.quantized_weight().describe(), "tq2_0") << name;
    ++layers;
  });
  EXPECT_EQ(layers, 2 * 5 + 1);  // qkv, proj, gate, up, down per layer, and the head
  GgufLoadOptions in_float;
  in_float.keep_quantized = false;
  const auto floats = load_gguf_model<LlamaModel<float>>(file, in_float);
  const std::vector<index_t> prompt{1, 17, 200, 45};
  const TokenBatch batch{prompt, 1, 4};
  const Tensor<float, 3> a = kept.forward(batch), b = floats.forward(batch);
  double gap = 0, scale = 0;
  for (index_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::fabs(double(a.data()[i]) - b.data()[i]));
    scale = std::max(scale, std::fabs(double(b.data()[i])));
  }
  EXPECT_GT(gap, 0.0);  // the kept blocks really ran (with q8_K activations)
  EXPECT_LE(gap, 5e-2 * scale);

  // A code of 3 (no quantiser writes it; llama.cpp would read +2·d) in blk.1.ffn_up's bytes.
  std::vector<std::byte> bytes(std::filesystem::file_size(path));
  std::ifstream(path, std::ios::binary)
      .read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  const GgufTensorInfo& up = file.info("blk.1.ffn_up.weight");
  bytes[std::size_t(file.data_offset() + up.offset + 66 + 5)] |= std::byte{0x0c};
  const GgufFile bad = GgufFile::from_bytes(std::move(bytes), "bad_tq2_0.gguf");
  try {
    (void)load_gguf_model<LlamaModel<float>>(bad);
    ADD_FAILURE() << "a tq2_0 code of 3 was kept";
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("bad_tq2_0.gguf: layers.1.mlp.up.weight (blk.1.ffn_up.weight): "
                        "QuantizedWeight::from_ggml(tq2_0): row 1, block 0 holds code 3 in byte 5"),
              std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW((void)load_gguf_model<LlamaModel<float>>(bad, in_float));
}

TEST(GgufModels, Bf16TensorsRunAsDissectsBf16WithTheSameBits) {
  // A BF16 file's matrices become dissect's bf16 weights, bit for bit (the bf16 GEMM and GEMV
  // run them), within bf16's activation rounding of the same model run in float.
  TemporaryDirectory directory;
  const auto path = directory / "llama_bf16.gguf";
  testing::write_random_gguf_model(path, ModelFamily::llama, GgmlType::bf16);
  const GgufFile file(path);
  ASSERT_EQ(file.info("blk.0.attn_q.weight").type, GgmlType::bf16);
  auto kept = load_gguf_model<LlamaModel<float>>(file);
  GgufLoadOptions in_float;
  in_float.keep_quantized = false;
  const auto floats = load_gguf_model<LlamaModel<float>>(file, in_float);
  std::map<std::string, const Linear<float>*> float_layers;
  for_each_layer(floats, [&](const std::string& name, const Linear<float>& layer) {
    float_layers[name] = &layer;
  });
  int layers = 0;
  for_each_layer(kept, [&](const std::string& name, Linear<float>& layer) {
    ASSERT_TRUE(layer.quantized()) << name;
    const QuantizedWeight& q = layer.quantized_weight();
    EXPECT_EQ(q.describe(), "bf16") << name;
    // The kept bits decode to exactly the float load's (un-permuted) weight.
    const Tensor<float, 2> decoded = q.dequantize();
    const auto& want = float_layers.at(name)->weight();
    ASSERT_EQ(decoded.size(), want.size()) << name;
    EXPECT_EQ(std::memcmp(decoded.data(), want.data(), std::size_t(decoded.size()) * 4), 0) << name;
    ++layers;
  });
  EXPECT_EQ(layers, 2 * 5 + 1);
  const std::vector<index_t> prompt{1, 17, 200, 45, 9, 3, 88, 120};
  const TokenBatch batch{prompt, 1, 8};
  const Tensor<float, 3> a = kept.forward(batch), b = floats.forward(batch);
  double gap = 0, scale = 0;
  for (index_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::fabs(double(a.data()[i]) - b.data()[i]));
    scale = std::max(scale, std::fabs(double(b.data()[i])));
  }
  EXPECT_GT(gap, 0.0);  // the bf16 kernels really ran (they round the activations to bf16)
  EXPECT_LE(gap, 5e-2 * scale);
}

TEST(GgufModels, ReleasingTheDenseWeightsKeepsTheLogitsAndOnlyTheBlocks) {
  // release_dense: the kept layers hold their blocks alone (what `dissect generate` loads), and
  // the model computes exactly what the default load (blocks plus the float copy) computes.
  for (const std::string name : {"llama_q4_k_m.gguf", "gpt2_q8_0.gguf"}) {
    SCOPED_TRACE(name);
    const GgufFile file(fixtures / name);
    const std::vector<index_t> prompt{1, 17, 200, 45, 9};
    GgufLoadOptions release;
    release.release_dense = true;
    Tensor<float, 3> both, blocks_only;
    index_t freed = 0;
    const auto check = [&](auto model_type) {
      using Model = typename decltype(model_type)::type;
      const Model with_copy = load_gguf_model<Model>(file);
      Model lean = load_gguf_model<Model>(file, release);
      index_t freed_weights = 0;
      for_each_layer(lean, [&](const std::string& path, Linear<float>& layer) {
        if (!layer.dense_weight_released()) return;
        ++freed;
        freed_weights += layer.in_features() * layer.out_features();
        EXPECT_THROW_WITH((void)layer.weight(), Error, "Linear::weight: the dense weight");
      });
      // The freed weights are no parameters any more; everything else is as loaded.
      EXPECT_EQ(with_copy.parameter_count() - lean.parameter_count(), freed_weights);
      const TokenBatch batch{prompt, 1, static_cast<index_t>(prompt.size())};
      both = with_copy.forward(batch);
      blocks_only = lean.forward(batch);
    };
    if (name.starts_with("llama")) {
      check(std::type_identity<LlamaModel<float>>{});
    } else {
      check(std::type_identity<GPT2Model<float>>{});
    }
    EXPECT_GT(freed, 0);
    ASSERT_EQ(both.size(), blocks_only.size());
    EXPECT_EQ(std::memcmp(both.data(), blocks_only.data(), std::size_t(both.size()) * 4), 0);
  }
}

TEST(GgufModels, AFileOfTheOtherFamilyIsRefused) {
  TemporaryDirectory directory;
  testing::write_random_gguf_model(directory / "g.gguf", ModelFamily::gpt2, GgmlType::q8_0);
  const GgufFile file(directory / "g.gguf");
  EXPECT_THROW((void)load_gguf_model<LlamaModel<float>>(file), ConfigError);
}

}  // namespace test_gguf_models
}  // namespace dissect
