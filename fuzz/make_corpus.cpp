// fuzz/make_corpus.cpp — writes the harnesses' seed corpus (fuzz/corpus/<harness>/) with
// dissect itself: valid files of every kind each harness reads, from the tiny models of
// fuzz_support.hpp, and a few corrupt ones beside them. Regenerate after a format change:
//   build/fuzz/fuzz/dissect_make_corpus fuzz/corpus
// The files are small (the whole corpus stays well under 200 KB) so that CI's short runs spend
// their time mutating rather than reading seeds. Crashing inputs found later are added by hand
// (named crash-*) and are not rewritten here.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "dissect/io/lora_file.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/transforms/lora.hpp"
#include "dissect/transforms/quantize.hpp"
#include "fuzz_support.hpp"

namespace fs = std::filesystem;
using namespace dissect;

namespace {

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A safetensors file of `header` (as written, unpadded) followed by `data`.
std::string safetensors(std::string_view header, std::string_view data = "") {
  std::string bytes(8, '\0');
  const std::uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  return bytes + std::string(header) + std::string(data);
}

/// `bytes` with the 8-byte header length replaced.
std::string with_header_length(std::string bytes, std::uint64_t length) {
  std::memcpy(bytes.data(), &length, 8);
  return bytes;
}

/// The tiny GPT-2's state_dict under Hugging Face's names: Conv1D weights transposed to
/// [in, out], the attention-mask buffer beside them.
void write_hugging_face_gpt2(const fs::path& path, const fs::path& scratch) {
  const GPT2Model<float> model(fuzz::tiny_gpt2(), {.seed = 3});
  save_module(scratch, model);
  const SafetensorsFile file(scratch);
  std::vector<std::vector<float>> values;  // kept alive until save_safetensors returns
  std::vector<SaveEntry> entries;
  values.reserve(file.tensors().size() + 1);
  for (const TensorInfo& info : file.tensors()) {
    std::string name = info.name;
    bool conv = false;
    for (const auto& [hf, ours] : detail::gpt2_renames) {
      if (const auto at = name.find(ours); at != std::string::npos) {
        name.replace(at, ours.size(), hf);
        conv = info.shape.size() == 2;
      }
    }
    if (conv) {
      const auto w = file.load<float, 2>(info.name);
      const index_t rows = w.shape()[0], cols = w.shape()[1];
      auto& t = values.emplace_back(static_cast<std::size_t>(rows * cols));
      for (index_t r = 0; r < rows; ++r)
        for (index_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = w(r, c);
      entries.emplace_back(name, std::vector<index_t>{cols, rows}, std::span<const float>(t));
    } else {
      const auto bytes = file.bytes(info.name);
      entries.emplace_back(name, info.shape, StoredBytes{info.dtype, bytes});
    }
  }
  const index_t context = fuzz::tiny_gpt2().context;
  auto& mask = values.emplace_back(static_cast<std::size_t>(context * context), 1.0f);
  entries.emplace_back("h.0.attn.bias", std::vector<index_t>{1, 1, context, context},
                       std::span<const float>(mask));
  save_safetensors(path, entries, {{"format", "pt"}});
}

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

/// A LLaMA of D 8, L 1, H 2, H_kv 1, F 8, V 8 and context 8 under llama.cpp's keys and tensor
/// names (f32 weights from sin), with a vocabulary of `tokens` pieces (the model's 8 unless
/// told), `extra` metadata after the model's, and `extra_tensor`, if named, beside its own:
/// the seeds of the metadata checks (io/gguf_model.hpp), each a few kilobytes.
void write_tiny_llama_gguf(const fs::path& path, const GgufMetadata& extra, int tokens = 8,
                           std::string_view architecture = "llama",
                           std::string_view extra_tensor = "") {
  TransformerConfig config = fuzz::tiny_llama();
  config.d_model = 8;
  config.n_heads = 2;
  config.n_kv_heads = 1;
  config.d_ff = 8;
  config.vocab = 8;
  config.context = 8;
  GgufMetadata metadata{{"general.architecture", std::string(architecture)},
                        {"llama.context_length", std::uint32_t{8}},
                        {"llama.embedding_length", std::uint32_t{8}},
                        {"llama.block_count", std::uint32_t{1}},
                        {"llama.feed_forward_length", std::uint32_t{8}},
                        {"llama.attention.head_count", std::uint32_t{2}},
                        {"llama.attention.head_count_kv", std::uint32_t{1}},
                        {"llama.rope.freq_base", 10000.0f},
                        {"llama.attention.layer_norm_rms_epsilon", 1e-5f}};
  GgufValue::Array pieces, types;
  for (int i = 0; i < tokens; ++i) {
    static constexpr const char* special[] = {"<unk>", "<s>", "</s>"};
    pieces.emplace_back(i < 3 ? std::string(special[i])
                              : std::string(1, static_cast<char>('a' + i)));
    types.emplace_back(std::int32_t{i < 3 ? 3 : 1});
  }
  metadata.push_back({"tokenizer.ggml.model", "gpt2"});
  metadata.push_back({"tokenizer.ggml.pre", "gpt-2"});
  metadata.push_back({"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, pieces)});
  metadata.push_back({"tokenizer.ggml.token_type", GgufValue::array(GgufType::i32, types)});
  metadata.push_back({"tokenizer.ggml.merges", GgufValue::array(GgufType::string, {})});
  metadata.insert(metadata.end(), extra.begin(), extra.end());
  std::vector<GgufExpectedTensor> expected = gguf_model_tensors(ModelFamily::llama, config);
  if (!extra_tensor.empty()) expected.push_back({std::string(extra_tensor), {8}, ""});
  std::vector<std::vector<std::byte>> stored;
  std::vector<GgufTensorEntry> tensors;
  stored.reserve(expected.size());
  for (const GgufExpectedTensor& tensor : expected) {
    index_t n = 1;
    for (const index_t d : tensor.dims) n *= d;
    std::vector<float> values(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = 0.1f * std::sin(0.7f * static_cast<float>(i + stored.size()));
    stored.push_back(quantize_ggml(GgmlType::f32, values));
    tensors.push_back({tensor.name, GgmlType::f32, tensor.dims, stored.back()});
  }
  save_gguf(path, metadata, tensors);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* harness : {"safetensors", "hf_config", "checkpoint_index", "model_file",
                              "lora_file", "gguf", "gguf_tokenizer"}) {
    fs::create_directories(out / harness);
  }
  const fs::path scratch = fuzz::scratch_directory();

  // ---- safetensors: every dtype, ranks 0–3, an empty tensor, metadata; then corrupt ones.
  {
    const fs::path dir = out / "safetensors";
    const std::vector<float> f{1, -2, 3.5f, 0, 1e-40f, -0.0f};
    const std::vector<double> d{1, 2, 3};
    const std::vector<std::byte> i8{std::byte{1}, std::byte{0x80}, std::byte{0x7f}, std::byte{0}};
    save_safetensors(
        scratch / "all.safetensors",
        std::vector<SaveEntry>{{"matrix", {2, 3}, std::span<const float>(f)},
                               {"vector.f64", {3}, std::span<const double>(d)},
                               {"half", {3, 2}, std::span<const float>(f), SaveDtype::f16},
                               {"brain", {1, 2, 3}, std::span<const float>(f), SaveDtype::bf16},
                               {"scalar", {}, std::span<const float>(f).first(1)},
                               {"empty", {0, 4}, std::span<const float>()},
                               {"bytes", {2, 2}, StoredBytes{"I8", i8}},
                               {"nibbles", {4}, StoredBytes{"U8", i8}}},
        {{"format", "pt"}, {"note", "seed"}});
    const std::string all = read(scratch / "all.safetensors");
    write(dir / "all_dtypes.safetensors", all);
    save_safetensors(scratch / "one.safetensors",
                     std::vector<SaveEntry>{{"w", {2, 2}, std::span<const float>(f).first(4)}});
    const std::string one = read(scratch / "one.safetensors");
    write(dir / "one_tensor.safetensors", one);
    write(dir / "empty_header.safetensors", safetensors("{}"));
    write(dir / "corrupt_truncated.safetensors", all.substr(0, all.size() - 3));
    write(dir / "corrupt_header_past_end.safetensors", with_header_length(one, one.size()));
    write(dir / "corrupt_overlap.safetensors",
          safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                      std::string(4, '\0')));
    write(dir / "corrupt_repeated_key.safetensors",
          safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                      std::string(4, '\0')));
    write(dir / "corrupt_huge_shape.safetensors",
          safetensors(R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],)"
                      R"("data_offsets":[0,8]},"__metadata__":{"k":"v"}})",
                      std::string(8, '\0')));
  }

  // ---- config.json: gpt2 and llama as Hugging Face writes them; corrupt ones.
  {
    const fs::path dir = out / "hf_config";
    write(dir / "gpt2.json",
          R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null,)"
          R"( "vocab_size": 50257, "n_positions": 1024, "layer_norm_epsilon": 1e-05,)"
          R"( "activation_function": "gelu_new", "tie_word_embeddings": true,)"
          R"( "scale_attn_weights": true, "architectures": ["GPT2LMHeadModel"]})");
    write(dir / "tiny_gpt2.json", fuzz::tiny_gpt2_config_json);
    write(dir / "llama.json",
          R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,)"
          R"( "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,)"
          R"( "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,)"
          R"( "rope_theta": 10000.0, "tie_word_embeddings": false, "attention_bias": false,)"
          R"( "hidden_act": "silu", "rope_scaling": null, "head_dim": 128})");
    write(dir / "corrupt_repeated_key.json",
          R"({"model_type": "gpt2", "n_embd": 16, "n_embd": 32, "n": {"a": 1, "a": [2]}})");
    write(dir / "corrupt_unsupported.json",
          R"({"model_type": "llama", "hidden_size": 64, "rope_scaling": {"type": "linear"}})");
    write(dir / "corrupt_truncated.json", R"({"model_type": "gpt2", "n_embd": 1)");
  }

  // ---- model.safetensors.index.json, naming the harness's fixed shards (fuzz_checkpoint_index).
  {
    const fs::path dir = out / "checkpoint_index";
    write(
        dir / "two_shards.json",
        R"({"metadata": {"total_size": 32}, "weight_map": {"a": "model-00001-of-00002.safetensors",)"
        R"( "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
    write(dir / "one_shard.json", R"({"weight_map": {"c": "model-00002-of-00002.safetensors"}})");
    write(dir / "corrupt_missing_tensor.json",
          R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})");
    write(dir / "corrupt_other_files.json",
          R"({"weight_map": {"a": "broken.safetensors", "b": "notes.txt", "c": "sub",)"
          R"( "d": "../x", "e": "config.json", "f": "model.safetensors.index.json"}})");
    write(dir / "corrupt_no_weight_map.json", R"({"metadata": [], "weight_map": 3})");
  }

  // ---- model files: save_model (gpt2, llama, quantised in every format), Hugging Face names,
  // bare tensors, an adapter file (fuzz_model_file); adapter files (fuzz_lora_file).
  {
    const fs::path dir = out / "model_file";
    save_model(dir / "gpt2.safetensors", GPT2Model<float>(fuzz::tiny_gpt2(), {.seed = 1}),
               {{"vocab", "abc"}});
    for (const auto format : {WeightFormat::bf16, WeightFormat::int8, WeightFormat::q4_0}) {
      LlamaModel<float> model(fuzz::tiny_llama(), {.seed = 2});
      quantize_model(model, format);
      save_model(dir / ("llama_" + std::string(weight_format_name(format)) + ".safetensors"),
                 model);
    }
    write_hugging_face_gpt2(dir / "hugging_face_gpt2.safetensors", scratch / "plain.safetensors");
    save_module(dir / "state_dict.safetensors", GPT2Model<float>(fuzz::tiny_gpt2(), {.seed = 4}));

    GPT2Model<float> adapted(fuzz::tiny_gpt2(), {.seed = 5});
    apply_lora(adapted, {.adapter = {.rank = 2, .alpha = 4, .seed = 1}, .target_modules = {"qkv"}});
    save_adapters(dir / "adapter.safetensors", adapted);
    const fs::path lora = out / "lora_file";
    save_adapters(lora / "qkv_rank2.safetensors", adapted, {{"task", "seed"}});
    GPT2Model<float> wider(fuzz::tiny_gpt2(), {.seed = 6});
    apply_lora(wider,
               {.adapter = {.rank = 1, .alpha = 3, .seed = 2}, .target_modules = {"up", "down"}});
    save_adapters(lora / "mlp_rank1.safetensors", wider);
    const std::string good = read(lora / "qkv_rank2.safetensors");
    write(lora / "corrupt_truncated.safetensors", good.substr(0, good.size() - 5));
    write(lora / "corrupt_no_metadata.safetensors",
          safetensors(R"({"base_model.model.h.0.attn.qkv.lora_A.weight":)"
                      R"({"dtype":"F32","shape":[1,8],"data_offsets":[0,32]}})",
                      std::string(32, '\0')));
  }
  // ---- GGUF: every value type (nested arrays too), every block type dissect decodes, a custom
  // alignment; then corrupt ones (fuzz_gguf).
  {
    const fs::path dir = out / "gguf";
    using Array = GgufValue::Array;
    const std::vector<std::pair<std::string, GgufValue>> metadata{
        {"general.architecture", "llama"},
        {"u8", std::uint8_t{1}},
        {"i8", std::int8_t{-1}},
        {"u16", std::uint16_t{2}},
        {"i16", std::int16_t{-2}},
        {"u32", std::uint32_t{3}},
        {"i32", std::int32_t{-3}},
        {"f32", 0.5f},
        {"bool", true},
        {"u64", std::uint64_t{4}},
        {"i64", std::int64_t{-4}},
        {"f64", 0.25},
        {"tokens", GgufValue::array(GgufType::string, Array{"<s>", "a", ""})},
        {"nested", GgufValue::array(GgufType::array, Array{GgufValue::array(
                                                         GgufType::i32, Array{std::int32_t{7}})})},
    };
    std::vector<float> values(256);
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = std::sin(0.1f * static_cast<float>(i));
    std::vector<std::vector<std::byte>> stored;
    std::vector<GgufTensorEntry> tensors;
    for (const GgmlType type : {GgmlType::f32, GgmlType::f16, GgmlType::bf16, GgmlType::q4_0,
                                GgmlType::q4_1, GgmlType::q5_0, GgmlType::q5_1, GgmlType::q8_0,
                                GgmlType::q4_K, GgmlType::q5_K, GgmlType::q6_K}) {
      stored.push_back(quantize_ggml(type, values));
      tensors.push_back({ggml_type_name(type), type, {256}, stored.back()});
    }
    save_gguf(dir / "every_type.gguf", metadata, tensors);
    const std::vector<std::pair<std::string, GgufValue>> aligned{
        {"general.alignment", std::uint32_t{64}}};
    // Named, not a temporary: the entry's span borrows these bytes until save_gguf returns.
    const std::vector<std::byte> q8_0 = quantize_ggml(GgmlType::q8_0, std::span(values).first(96));
    const std::vector<GgufTensorEntry> matrix{
        {"blk.0.attn_q.weight", GgmlType::q8_0, {32, 3}, q8_0}, {"empty", GgmlType::f32, {0}, {}}};
    save_gguf(dir / "aligned_64.gguf", aligned, matrix);
    const std::string good = read(dir / "every_type.gguf");
    write(dir / "corrupt_truncated.gguf", good.substr(0, good.size() - 100));
    std::string huge_array = good;
    const std::size_t tokens = huge_array.find("tokens");
    const std::uint64_t count = std::uint64_t{1} << 62;  // after the key and the two type words
    std::memcpy(huge_array.data() + tokens + 6 + 8, &count, 8);
    write(dir / "corrupt_huge_array.gguf", huge_array);

    // The model metadata checks (reliability rows 124–129): a valid tiny LLaMA, then each way its
    // metadata can ask for another model than its tensors make or print what it should not.
    write_tiny_llama_gguf(dir / "llama_tiny.gguf", {});
    write_tiny_llama_gguf(dir / "rope_scaling_factor_1.gguf",
                          {{"llama.rope.scaling.factor", 1.0f}});  // no scaling: valid
    write_tiny_llama_gguf(dir / "rope_scaling_factor_4.gguf",
                          {{"llama.rope.scaling.factor", 4.0f}});  // llama.cpp: linear, 1/4
    write_tiny_llama_gguf(dir / "rope_scale_linear_4.gguf", {{"llama.rope.scale_linear", 4.0f}});
    write_tiny_llama_gguf(dir / "rope_scaling_yarn.gguf",
                          {{"llama.rope.scaling.type", "yarn"},
                           {"llama.rope.scaling.factor", 8.0f},
                           {"llama.rope.scaling.original_context_length", std::uint32_t{4}},
                           {"llama.rope.scaling.attn_factor", 1.2f}});
    write_tiny_llama_gguf(
        dir / "expert_count_dense.gguf",
        {{"llama.expert_count", std::uint32_t{8}}, {"llama.expert_used_count", std::uint32_t{2}}});
    write_tiny_llama_gguf(dir / "vocab_mismatch.gguf", {}, 6);  // 6 tokens, 8 embedding rows
    write_tiny_llama_gguf(
        dir / "not_utf8.gguf",
        {{"general.name", "bad \xc3\x28 name"},
         {"general.\xff\xfekey", std::uint32_t{1}},
         {"general.tags",
          GgufValue::array(GgufType::string, GgufValue::Array{"ok", "\xed\xa0\x80"})}});
    write_tiny_llama_gguf(dir / "not_utf8_architecture.gguf", {}, 8, "lla\xffma");
    write_tiny_llama_gguf(dir / "escape_sequences.gguf",
                          {{"general.\x1b[2Jtitle",
                            "\x1b]0;pwned\x07\x1b[31mred\xc2\x9b"
                            "0m"}},
                          8, "llama", "\x1b[31mevil\x1b[0m");
    write_tiny_llama_gguf(dir / "escape_architecture.gguf", {}, 8, "\x1b[2J\x1b[31mllama");
    // A tokenizer of another size than the embedding, for the tokenizer harness too.
    fs::copy_file(dir / "vocab_mismatch.gguf", out / "gguf_tokenizer" / "vocab_mismatch.gguf",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(dir / "not_utf8.gguf", out / "gguf_tokenizer" / "not_utf8.gguf",
                  fs::copy_options::overwrite_existing);
  }
  // ---- GGUF tokenizers: a small SentencePiece and a small byte-level BPE vocabulary, as
  // tokenizer.ggml.* (fuzz_gguf_tokenizer).
  {
    const fs::path dir = out / "gguf_tokenizer";
    using Array = GgufValue::Array;
    Array tokens{"<unk>", "<s>", "</s>"}, scores{0.0f, 0.0f, 0.0f},
        types{std::int32_t{2}, std::int32_t{3}, std::int32_t{3}};
    for (int b = 0; b < 256; ++b) {
      static constexpr char hex[] = "0123456789ABCDEF";
      tokens.emplace_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
      scores.emplace_back(0.0f);
      types.emplace_back(std::int32_t{6});
    }
    for (const char* piece : {"\xe2\x96\x81", "a", "b", "ab",
                              "\xe2\x96\x81"
                              "a",
                              "ba"}) {
      tokens.emplace_back(piece);
      scores.emplace_back(-static_cast<float>(tokens.size()));
      types.emplace_back(std::int32_t{1});
    }
    save_gguf(dir / "spm.gguf",
              std::vector<std::pair<std::string, GgufValue>>{
                  {"tokenizer.ggml.model", "llama"},
                  {"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, tokens)},
                  {"tokenizer.ggml.scores", GgufValue::array(GgufType::f32, scores)},
                  {"tokenizer.ggml.token_type", GgufValue::array(GgufType::i32, types)},
                  {"tokenizer.ggml.bos_token_id", std::uint32_t{1}},
                  {"tokenizer.ggml.add_space_prefix", true}},
              {});
    save_gguf(
        dir / "bpe.gguf",
        std::vector<std::pair<std::string, GgufValue>>{
            {"tokenizer.ggml.model", "gpt2"},
            {"tokenizer.ggml.pre", "llama-bpe"},
            {"tokenizer.ggml.tokens",
             GgufValue::array(GgufType::string, Array{"a", "b", "ab", "\xc4\xa0", "<|end|>"})},
            {"tokenizer.ggml.token_type",
             GgufValue::array(GgufType::i32,
                              Array{std::int32_t{1}, std::int32_t{1}, std::int32_t{1},
                                    std::int32_t{1}, std::int32_t{3}})},
            {"tokenizer.ggml.merges", GgufValue::array(GgufType::string, Array{"a b"})},
            {"tokenizer.ggml.bos_token_id", std::uint32_t{4}}},
        {});
  }
  std::error_code ignored;
  fs::remove_all(scratch, ignored);
  std::printf("wrote the seed corpus to %s\n", out.c_str());
  return 0;
}
