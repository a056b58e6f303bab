// Tests for dissect/io/gguf.hpp: a file llama.cpp wrote (blocks.gguf) read field by field,
// rewritten by save_gguf to the same bytes, round trips of every value type (nested arrays
// included) and alignment, and — the reliability issue's classes — one test per kind of lying or
// truncated file, each asserting FormatError and that the message names the file and the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dissect/accounting/count.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "dissect/io/gguf_quantize.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "support/io_testing.hpp"

namespace dissect {
namespace test_gguf {

using testing::contains;
using testing::read_file;
using testing::TemporaryDirectory;

const std::filesystem::path blocks_path =
    std::filesystem::path(DISSECT_GGUF_FIXTURE_DIR) / "blocks.gguf";

TEST(GgufRead, ReadsTheFileLlamaCppWrote) {
  const GgufFile file(blocks_path);
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.data_offset() % 32, 0);
  EXPECT_EQ(file.require_string("general.architecture"), "dissect-fixture");
  EXPECT_EQ(file.find("test.u8")->storage(), GgufValue::Storage(std::uint8_t{200}));
  EXPECT_EQ(file.find("test.i8")->storage(), GgufValue::Storage(std::int8_t{-100}));
  EXPECT_EQ(file.find("test.u16")->storage(), GgufValue::Storage(std::uint16_t{60000}));
  EXPECT_EQ(file.find("test.i16")->storage(), GgufValue::Storage(std::int16_t{-30000}));
  EXPECT_EQ(file.find("test.u32")->storage(), GgufValue::Storage(std::uint32_t{4000000000u}));
  EXPECT_EQ(file.find("test.i32")->storage(), GgufValue::Storage(std::int32_t{-2000000000}));
  EXPECT_EQ(file.find("test.f32")->storage(), GgufValue::Storage(0.1f));
  EXPECT_EQ(file.find("test.u64")->storage(),
            GgufValue::Storage(std::uint64_t{18000000000000000000ull}));
  EXPECT_EQ(file.find("test.i64")->storage(),
            GgufValue::Storage(std::int64_t{-9000000000000000000ll}));
  EXPECT_EQ(file.find("test.f64")->storage(), GgufValue::Storage(-2.5e300));
  EXPECT_EQ(file.find("test.bool")->as_bool(), true);
  EXPECT_EQ(file.require_string("test.string"), "na\xc3\xafve \xe2\x86\x92 ok");
  const GgufValue::Array& ints = file.require_array("test.array_i32");
  ASSERT_EQ(ints.size(), 3u);
  EXPECT_EQ(file.find("test.array_i32")->element_type(), GgufType::i32);
  EXPECT_EQ(ints[1].as_signed(), -2);
  EXPECT_EQ(file.require_array("test.array_f32")[1].as_number(), -1.25);
  const GgufValue::Array& strings = file.require_array("test.array_string");
  ASSERT_EQ(strings.size(), 3u);
  EXPECT_EQ(*strings[2].as_string(), "\xe4\xb8\xad");
  EXPECT_EQ(*strings[1].as_string(), "");
  EXPECT_TRUE(file.require_array("test.array_empty").empty());
  EXPECT_EQ(file.require_unsigned("test.u32"), 4000000000u);

  const GgufTensorInfo& source = file.info("source");
  EXPECT_EQ(source.type, GgmlType::f32);
  EXPECT_EQ(source.dims, (std::vector<index_t>{512, 16}));
  EXPECT_EQ(source.shape(), (std::vector<index_t>{16, 512}));
  EXPECT_EQ(source.bytes, 16 * 512 * 4);
  const GgufTensorInfo& q4k = file.info("q4_K");
  EXPECT_EQ(q4k.type, GgmlType::q4_K);
  EXPECT_EQ(q4k.bytes, 16 * 2 * 144);
  EXPECT_EQ(file.tensors().size(), 25u);  // source, then each of 12 types and its dequantisation
  const Tensor<float, 2> matrix = file.load<2>("source");
  EXPECT_EQ(matrix.dim(0), 16);
  EXPECT_EQ(matrix.dim(1), 512);
  EXPECT_EQ(std::memcmp(matrix.data(), file.bytes("source").data(), 16 * 512 * 4), 0);
  EXPECT_THROW(file.load<1>("source"), ShapeError);
}

TEST(GgufRead, RequiredKeysNameTheFileAndKey) {
  const GgufFile file(blocks_path);
  try {
    file.require_unsigned("test.i8");
    FAIL() << "no throw";
  } catch (const FormatError& error) {
    EXPECT_TRUE(contains(error.what(), "blocks.gguf"));
    EXPECT_TRUE(contains(error.what(), "test.i8"));
    EXPECT_TRUE(contains(error.what(), "-100"));
  }
  EXPECT_THROW(file.require_string("no.such.key"), FormatError);
  EXPECT_THROW(file.require_array("test.string"), FormatError);
  EXPECT_THROW(file.info("no_tensor"), Error);
}

std::vector<std::pair<std::string, GgufValue>> metadata_of(const GgufFile& file) {
  return file.metadata();
}

std::vector<GgufTensorEntry> entries_of(const GgufFile& file) {
  std::vector<GgufTensorEntry> entries;
  for (const GgufTensorInfo& info : file.tensors()) {
    entries.push_back({info.name, info.type, info.dims, file.bytes(info.name)});
  }
  return entries;
}

TEST(GgufWrite, RewritesLlamaCppsFileByteForByte) {
  const GgufFile file(blocks_path);
  TemporaryDirectory directory;
  const auto metadata = metadata_of(file);
  const auto entries = entries_of(file);
  save_gguf(directory / "copy.gguf", metadata, entries);
  EXPECT_EQ(read_file(directory / "copy.gguf"), read_file(blocks_path));
}

TEST(GgufWrite, RoundTripsEveryValueTypeAndAlignment) {
  using Array = GgufValue::Array;
  const std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.alignment", std::uint32_t{64}},
      {"a.u8", std::uint8_t{7}},
      {"a.f64", 1e-300},
      {"a.bool", false},
      {"a.string", "x\ny"},
      {"a.nested", GgufValue::array(GgufType::array,
                                    Array{GgufValue::array(GgufType::u16, Array{std::uint16_t{1}}),
                                          GgufValue::array(GgufType::u16, Array{})})},
      {"a.strings", GgufValue::array(GgufType::string, Array{"one", "two"})},
  };
  const std::vector<float> values{1, 2, 3, 4, 5};
  std::vector<float> block_values(64);
  // k/16 for odd k up to ±127, each block holding −127/16: its scale 1/16 is exact in fp16, so
  // q8_0 stores every value exactly.
  for (int i = 0; i < 64; ++i) {
    block_values[static_cast<std::size_t>(i)] = static_cast<float>((i % 32) * 8 - 127) / 16;
  }
  const std::vector<std::byte> q8 = quantize_ggml(GgmlType::q8_0, block_values);
  const std::vector<GgufTensorEntry> tensors{
      {"vector", GgmlType::f32, {5}, std::as_bytes(std::span(values))},
      {"blocks", GgmlType::q8_0, {32, 2}, q8},
      {"empty", GgmlType::f32, {0, 3}, {}},
  };
  TemporaryDirectory directory;
  save_gguf(directory / "a.gguf", metadata, tensors);
  const GgufFile file(directory / "a.gguf");
  EXPECT_EQ(file.alignment(), 64u);
  EXPECT_EQ(file.data_offset() % 64, 0);
  ASSERT_EQ(file.metadata().size(), metadata.size());
  for (std::size_t i = 0; i < metadata.size(); ++i) {
    EXPECT_EQ(file.metadata()[i].first, metadata[i].first);
    EXPECT_EQ(file.metadata()[i].second.describe(), metadata[i].second.describe());
  }
  EXPECT_EQ(file.find("a.nested")->as_array()->at(0).element_type(), GgufType::u16);
  EXPECT_EQ(file.dequantize("vector"), values);
  EXPECT_EQ(file.info("blocks").offset % 64, 0);
  EXPECT_EQ(file.dequantize("blocks"), block_values);
  EXPECT_EQ(file.info("empty").bytes, 0);
  EXPECT_TRUE(file.dequantize("empty").empty());  // the fuzzer's first find: memcpy of nothing
  EXPECT_EQ(file.info("empty").shape(), (std::vector<index_t>{3, 0}));
}

TEST(GgufWrite, RefusesWhatItCannotWrite) {
  TemporaryDirectory directory;
  const std::vector<float> values(33, 1.0f);
  const std::vector<std::pair<std::string, GgufValue>> none;
  auto refuse = [&](std::vector<std::pair<std::string, GgufValue>> metadata,
                    std::vector<GgufTensorEntry> tensors, std::string_view part) {
    try {
      save_gguf(directory / "x.gguf", metadata, tensors);
      ADD_FAILURE() << "no throw for " << part;
    } catch (const Error& error) {
      EXPECT_TRUE(contains(error.what(), part));
    }
    EXPECT_FALSE(std::filesystem::exists(directory / "x.gguf"));
  };
  const auto bytes = std::as_bytes(std::span(values));
  refuse({{"k", 1}, {"k", 2}}, {}, "given twice");
  refuse({{"general.alignment", std::uint64_t{32}}}, {}, "general.alignment");
  refuse({{"general.alignment", std::uint32_t{48}}}, {}, "power of two");
  refuse({{"bad", GgufValue::array(GgufType::u8, {std::int32_t{1}})}}, {}, "holding a i32");
  refuse(none, {{"t", GgmlType::f32, {33}, bytes.first(128)}}, "takes 132 bytes");
  refuse(none, {{"t", GgmlType::q8_0, {33}, bytes}}, "whole number of q8_0 blocks");
  refuse(none, {{std::string(64, 'n'), GgmlType::f32, {33}, bytes}}, "63 bytes");
  refuse(none, {{"t", GgmlType::f32, {33}, bytes}, {"t", GgmlType::f32, {33}, bytes}},
         "given twice");
  refuse(none, {{"t", GgmlType::f32, {1, 1, 1, 1, 33}, bytes}}, "5 dims");
}

// ---- corrupt files ----------------------------------------------------------------------------

/// A GGUF file built field by field, so that each test can make one field lie.
struct Builder {
  std::vector<std::byte> out;
  template <class T>
  Builder& put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    out.insert(out.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(std::string_view text) {
    put<std::uint64_t>(text.size());
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    out.insert(out.end(), p, p + text.size());
    return *this;
  }
  Builder& header(std::int64_t tensors, std::int64_t keys, std::uint32_t version = 3) {
    return put<std::uint32_t>(0x46554747u).put(version).put(tensors).put(keys);
  }
  Builder& pad(std::size_t alignment = 32) {
    out.resize((out.size() + alignment - 1) / alignment * alignment);
    return *this;
  }
  Builder& zeros(std::size_t n) {
    out.resize(out.size() + n);
    return *this;
  }
  /// A tensor record.
  Builder& tensor(std::string_view name, std::vector<std::int64_t> dims, std::uint32_t type,
                  std::uint64_t offset) {
    str(name).put<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
    for (const std::int64_t d : dims) put(d);
    return put(type).put(offset);
  }
};

/// Opens `bytes` and expects a FormatError whose message names the file and holds `part`.
void expect_corrupt(const std::vector<std::byte>& bytes, std::string_view part) {
  try {
    GgufFile::from_bytes(bytes, "lying.gguf");
    ADD_FAILURE() << "no throw; expected: " << part;
  } catch (const FormatError& error) {
    EXPECT_TRUE(contains(error.what(), "lying.gguf"));
    EXPECT_TRUE(contains(error.what(), part));
  }
}

TEST(GgufCorrupt, HeaderLies) {
  expect_corrupt(Builder().put<std::uint32_t>(0x46554746u).zeros(20).out, "not a GGUF file");
  expect_corrupt(Builder().header(0, 0, 1).out, "version 1");
  expect_corrupt(Builder().header(0, 0, 0x03000000u).out, "big-endian");
  expect_corrupt(Builder().header(0, 0, 4).out, "version 4");
  expect_corrupt(Builder().header(0, 1'000'000).out, "claims 1000000 metadata entries");
  expect_corrupt(Builder().header(-1, 0).out, "claims -1 tensors");
  expect_corrupt(Builder().header(1ll << 62, 0).out, "tensors");
  expect_corrupt(Builder().put<std::uint32_t>(0x46554747u).put<std::uint16_t>(3).out, "truncated");
}

TEST(GgufCorrupt, MetadataLies) {
  expect_corrupt(Builder().header(0, 1).str("k").put<std::uint32_t>(8).put<std::uint64_t>(1000).out,
                 "longer than the");
  expect_corrupt(Builder().header(0, 1).put<std::uint64_t>(1ull << 63).zeros(16).out,
                 "longer than the");
  expect_corrupt(Builder().header(0, 1).str("k").put<std::uint32_t>(13).zeros(8).out,
                 "value type 13");
  expect_corrupt(Builder()
                     .header(0, 1)
                     .str("arr")
                     .put<std::uint32_t>(9)
                     .put<std::uint32_t>(4)
                     .put<std::uint64_t>(1ull << 62)
                     .zeros(64)
                     .out,
                 "claims 4611686018427387904 elements");
  expect_corrupt(Builder().header(0, 1).str("b").put<std::uint32_t>(7).put<std::uint8_t>(2).out,
                 "bool stored as 2");
  expect_corrupt(Builder()
                     .header(0, 2)
                     .str("k")
                     .put<std::uint32_t>(0)
                     .put<std::uint8_t>(1)
                     .str("k")
                     .put<std::uint32_t>(0)
                     .put<std::uint8_t>(1)
                     .out,
                 "\"k\" appears twice");
  expect_corrupt(Builder().header(0, 1).str("").put<std::uint32_t>(0).put<std::uint8_t>(1).out,
                 "is empty");
  Builder deep;
  deep.header(0, 1).str("deep").put<std::uint32_t>(9);
  for (int i = 0; i < 20; ++i) deep.put<std::uint32_t>(9).put<std::uint64_t>(1);
  deep.zeros(64);
  expect_corrupt(deep.out, "more than 16 deep");
  expect_corrupt(Builder()
                     .header(0, 1)
                     .str("general.alignment")
                     .put<std::uint32_t>(10)
                     .put<std::uint64_t>(32)
                     .out,
                 "requires a u32");
  expect_corrupt(Builder()
                     .header(0, 1)
                     .str("general.alignment")
                     .put<std::uint32_t>(4)
                     .put<std::uint32_t>(24)
                     .out,
                 "not a power of two");
}

TEST(GgufCorrupt, TensorRecordsLie) {
  expect_corrupt(
      Builder().header(1, 0).tensor(std::string(64, 't'), {32}, 0, 0).pad().zeros(128).out,
      "its name is 64 bytes");
  expect_corrupt(Builder().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(64).out,
                 "5 dims");
  expect_corrupt(Builder().header(1, 0).tensor("t", {-4}, 0, 0).pad().zeros(64).out,
                 "dim 0 is negative");
  expect_corrupt(Builder().header(1, 0).tensor("t", {32}, 4, 0).pad().zeros(64).out, "ggml type 4");
  expect_corrupt(Builder().header(1, 0).tensor("t", {33, 2}, 2, 0).pad().zeros(128).out,
                 "not whole blocks");
  expect_corrupt(Builder().header(1, 0).tensor("t", {32}, 0, 16).pad().zeros(256).out,
                 "not a multiple of the alignment");
  expect_corrupt(Builder().header(1, 0).tensor("t", {32, 3}, 0, 0).pad().zeros(100).out,
                 "truncated");
  expect_corrupt(Builder().header(1, 0).tensor("t", {8}, 0, 1ull << 63).pad().zeros(64).out,
                 "beyond any file");
  expect_corrupt(
      Builder().header(2, 0).tensor("a", {16}, 0, 0).tensor("a", {16}, 0, 64).pad().zeros(128).out,
      "\"a\" appears twice");
  expect_corrupt(
      Builder().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().zeros(96).out,
      "overlap");
  try {
    GgufFile::from_bytes(
        Builder().header(1, 0).tensor("t", {1ll << 40, 1ll << 40}, 0, 0).pad().zeros(32).out,
        "lying.gguf");
    FAIL() << "no throw";
  } catch (const OverflowError& error) {
    EXPECT_TRUE(contains(error.what(), "lying.gguf"));
    EXPECT_TRUE(contains(error.what(), "\"t\""));
  }
}

TEST(GgufRead, AnEmptyTensorMayLieAnywhere) {
  // It reads no byte, so its (aligned) offset is not held against the file's size.
  const GgufFile file = GgufFile::from_bytes(
      Builder().header(1, 0).tensor("e", {0, 4}, 0, 1u << 20).pad().out, "empty.gguf");
  EXPECT_TRUE(file.bytes("e").empty());
  EXPECT_TRUE(file.dequantize("e").empty());
}

TEST(GgufCorrupt, EveryTruncationOfARealFileIsRefused) {
  // llama.cpp's own file cut at every length through its records, and at a few in its data:
  // each must be a FormatError, never a read past the end.
  const std::vector<std::byte> whole = read_file(blocks_path);
  const GgufFile file = GgufFile::from_bytes(whole, "whole.gguf");
  const auto records_end = static_cast<std::size_t>(file.data_offset());
  for (std::size_t length = 0; length < whole.size();
       length += length < records_end + 64 ? 1 : 4099) {
    const std::vector<std::byte> cut(whole.begin(),
                                     whole.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_THROW(GgufFile::from_bytes(cut, "cut.gguf"), FormatError) << "length " << length;
  }
}

// ---- the model a file describes
// ------------------------------------------------------------------

/// A tiny LLaMA's GGUF: llama.cpp's keys and tensor names, zero weights (only shapes matter here).
struct TinyLlamaFile {
  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", "llama"},
      {"llama.context_length", std::uint32_t{64}},
      {"llama.embedding_length", std::uint32_t{32}},
      {"llama.block_count", std::uint32_t{2}},
      {"llama.feed_forward_length", std::uint32_t{96}},
      {"llama.attention.head_count", std::uint32_t{4}},
      {"llama.attention.head_count_kv", std::uint32_t{2}},
      {"llama.rope.freq_base", 500000.0f},
      {"llama.attention.layer_norm_rms_epsilon", 1e-6f},
      {"llama.rope.dimension_count", std::uint32_t{8}},
  };
  std::vector<GgufExpectedTensor> tensors;
  std::vector<std::vector<std::byte>> storage;

  TinyLlamaFile() {
    TransformerConfig config = detail::llama_style(32, 2, 4, 96, 64);
    config.n_kv_heads = 2;
    config.vocab = 50;
    tensors = gguf_model_tensors(ModelFamily::llama, config);
  }
  void save(const std::filesystem::path& path) {
    std::vector<GgufTensorEntry> entries;
    storage.clear();
    storage.reserve(tensors.size());
    for (const GgufExpectedTensor& tensor : tensors) {
      index_t n = 1;
      for (const index_t d : tensor.dims) n *= d;
      storage.emplace_back(static_cast<std::size_t>(n) * 4);
      entries.push_back({tensor.name, GgmlType::f32, tensor.dims, storage.back()});
    }
    save_gguf(path, metadata, entries);
  }
};

TEST(GgufModel, ReadsALlamaConfigAndCountsItsTensors) {
  TemporaryDirectory directory;
  TinyLlamaFile tiny;
  tiny.save(directory / "tiny.gguf");
  const GgufFile file(directory / "tiny.gguf");
  const HfConfig model = read_gguf_config(file);
  EXPECT_EQ(model.family, ModelFamily::llama);
  EXPECT_EQ(model.config.d_model, 32);
  EXPECT_EQ(model.config.kv_heads(), 2);
  EXPECT_EQ(model.config.vocab, 50);
  EXPECT_FALSE(model.config.tied_embeddings);
  EXPECT_EQ(model.config.rope_theta, 500000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(*model.config.norm_eps), 1e-6f);
  index_t elements = 0;
  for (const GgufTensorInfo& info : file.tensors()) elements += info.elements();
  EXPECT_EQ(count_parameters(model.config).total, elements);
}

void expect_bad_model(TinyLlamaFile tiny, std::string_view part) {
  TemporaryDirectory directory;
  tiny.save(directory / "bad.gguf");
  const GgufFile file(directory / "bad.gguf");
  try {
    (void)read_gguf_config(file);
    ADD_FAILURE() << "no throw; expected " << part;
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "bad.gguf"));
    EXPECT_TRUE(contains(error.what(), part));
  }
}

TEST(GgufModel, MetadataContradictingTensorsIsRefused) {
  {
    TinyLlamaFile tiny;
    tiny.tensors[3].dims = {32, 12};  // blk.0.attn_k: 3 heads' worth, not head_count_kv's 2
    expect_bad_model(tiny, "tensor \"blk.0.attn_k.weight\" has dims {32, 12}");
  }
  {
    TinyLlamaFile tiny;
    tiny.tensors.pop_back();  // output.weight gone: tied, fine; drop a block tensor instead
    tiny.tensors.erase(tiny.tensors.begin() + 6);
    expect_bad_model(tiny, "has no tensor \"blk.0.ffn_norm.weight\"");
  }
  {
    TinyLlamaFile tiny;
    tiny.tensors.push_back({"rope_freqs.weight", {4}, ""});
    expect_bad_model(tiny, "RoPE scaling");
  }
  {
    TinyLlamaFile tiny;
    tiny.metadata[3].second = std::uint32_t{3};  // block_count 3: blk.2 is missing
    expect_bad_model(tiny, "has no tensor \"blk.2.attn_norm.weight\"");
  }
  {
    TinyLlamaFile tiny;
    tiny.metadata[0].second = "mamba";
    expect_bad_model(tiny, "\"mamba\" is not one dissect builds");
  }
  {
    TinyLlamaFile tiny;
    tiny.metadata[5].second = std::int32_t{-4};
    expect_bad_model(tiny, "llama.attention.head_count");
  }
  {
    TinyLlamaFile tiny;
    tiny.metadata[9].second = std::uint32_t{4};
    expect_bad_model(tiny, "rotates part of each head");
  }
  {
    TinyLlamaFile tiny;
    tiny.metadata[6].second = std::uint32_t{3};  // 4 heads over 3 KV heads
    expect_bad_model(tiny, "n_kv_heads");
  }
}

// ---- metadata that asks for another model than dissect builds (reliability rows 124, 128, 129)

/// TinyLlamaFile with `entries` added to its metadata.
TinyLlamaFile with_metadata(std::vector<std::pair<std::string, GgufValue>> entries) {
  TinyLlamaFile tiny;
  for (auto& entry : entries) tiny.metadata.push_back(std::move(entry));
  return tiny;
}

/// Whether read_gguf_config accepts `tiny`; a refusal's message goes to the test's output.
::testing::AssertionResult loads(TinyLlamaFile tiny) {
  TemporaryDirectory directory;
  tiny.save(directory / "tiny.gguf");
  try {
    (void)read_gguf_config(GgufFile(directory / "tiny.gguf"));
    return ::testing::AssertionSuccess();
  } catch (const Error& error) {
    return ::testing::AssertionFailure() << error.what();
  }
}

/// read_gguf_config of `tiny` must throw FormatError naming the file and holding every part.
void expect_refused(TinyLlamaFile tiny, std::initializer_list<std::string_view> parts) {
  TemporaryDirectory directory;
  tiny.save(directory / "bad.gguf");
  try {
    (void)read_gguf_config(GgufFile(directory / "bad.gguf"));
    ADD_FAILURE() << "no throw; expected " << *parts.begin();
  } catch (const FormatError& error) {
    EXPECT_TRUE(contains(error.what(), "bad.gguf"));
    for (const std::string_view part : parts) EXPECT_TRUE(contains(error.what(), part));
  }
}

// Row 124. llama.cpp defaults rope.scaling.type to "linear" and reads rope.scaling.factor (or,
// without it, the older rope.scale_linear) as freq_scale = 1/factor; a factor of 0 or 1 is no
// scaling; type "none" never scales; attn_factor scales every rotation whatever the type.
TEST(GgufModel, ARopeScalingFactorWithoutATypeIsRefusedAsTheLinearScalingLlamaCppRuns) {
  expect_refused(
      with_metadata({{"llama.rope.scaling.factor", 4.0f}}),
      {"metadata \"llama.rope.scaling.factor\" is 4", "\"llama.rope.scaling.type\" is absent",
       "linear RoPE scaling", "dissect does not run yet"});
  expect_refused(with_metadata({{"llama.rope.scale_linear", 4.0f}}),
                 {"metadata \"llama.rope.scale_linear\" is 4", "linear RoPE scaling"});
  expect_refused(with_metadata({{"llama.rope.scaling.factor", 0.25}}),  // an f64 shrinks too
                 {"\"llama.rope.scaling.factor\" is 0.25"});
  expect_refused(with_metadata({{"llama.rope.scaling.factor", std::uint32_t{2}}}),
                 {"\"llama.rope.scaling.factor\" is 2"});
  expect_refused(
      with_metadata({{"llama.rope.scaling.factor", std::numeric_limits<float>::quiet_NaN()}}),
      {"\"llama.rope.scaling.factor\" is nan"});
  expect_refused(with_metadata({{"llama.rope.scaling.factor", "4"}}),
                 {"\"llama.rope.scaling.factor\" is string \"4\", not a number"});
  // The new key wins over the old one, as in llama.cpp: factor 1 and scale_linear 4 is unscaled,
  // factor 4 and scale_linear 1 is scaled.
  EXPECT_TRUE(loads(
      with_metadata({{"llama.rope.scaling.factor", 1.0f}, {"llama.rope.scale_linear", 4.0f}})));
  expect_refused(
      with_metadata({{"llama.rope.scaling.factor", 4.0f}, {"llama.rope.scale_linear", 1.0f}}),
      {"\"llama.rope.scaling.factor\" is 4"});
  // No scaling: a factor of exactly 1 (either key), llama.cpp's 0, and any factor under "none".
  EXPECT_TRUE(loads(with_metadata({{"llama.rope.scaling.factor", 1.0f}})));
  EXPECT_TRUE(loads(with_metadata({{"llama.rope.scale_linear", 1.0f}})));
  EXPECT_TRUE(loads(with_metadata({{"llama.rope.scaling.factor", 0.0f}})));
  EXPECT_TRUE(loads(
      with_metadata({{"llama.rope.scaling.type", "none"}, {"llama.rope.scaling.factor", 4.0f}})));
  EXPECT_TRUE(
      loads(with_metadata({{"llama.rope.scaling.attn_factor", 1.0f},
                           {"llama.rope.scaling.original_context_length", std::uint32_t{8192}}})));
  // Any scaling type but "none" stays refused, with its keys or without.
  for (const char* type : {"linear", "yarn", "longrope", "dynamic", ""}) {
    expect_refused(
        with_metadata({{"llama.rope.scaling.type", type},
                       {"llama.rope.scaling.factor", 1.0f},
                       {"llama.rope.scaling.original_context_length", std::uint32_t{4096}}}),
        {"metadata \"llama.rope.scaling.type\" is", "RoPE scaling is not supported"});
  }
  expect_refused(with_metadata({{"llama.rope.scaling.type", std::uint32_t{1}}}),
                 {"\"llama.rope.scaling.type\" is 1"});
  expect_refused(with_metadata({{"llama.rope.scaling.attn_factor", 1.5f}}),
                 {"\"llama.rope.scaling.attn_factor\" is f32 1.5", "scales every rotated query"});
  expect_refused(with_metadata({{"llama.rope.scaling.type", "none"},
                                {"llama.rope.scaling.attn_factor", 0.5f}}),
                 {"\"llama.rope.scaling.attn_factor\" is f32 0.5"});
}

// Row 124: everything that reads a GGUF model goes through read_gguf_config, so the loader,
// llama.cpp's quantiser (nothing written: its output would run unscaled the same way) and
// the way to a Hugging Face checkpoint (tests/tools: convert_gguf_rope_scaling) refuse alike.
TEST(GgufModel, LoadingAndQuantisingAScaledFileAreRefusedToo) {
  TemporaryDirectory directory;
  TinyLlamaFile tiny = with_metadata({{"llama.rope.scale_linear", 4.0f}});
  tiny.save(directory / "scaled.gguf");
  const GgufFile file(directory / "scaled.gguf");
  try {
    (void)load_gguf_model<LlamaModel<float>>(file);
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& error) {
    EXPECT_TRUE(contains(error.what(), "\"llama.rope.scale_linear\" is 4"));
  }
  try {
    quantize_gguf(file, directory / "q8_0.gguf", GgufRecipe::q8_0);
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& error) {
    EXPECT_TRUE(contains(error.what(), "linear RoPE scaling"));
  }
  EXPECT_FALSE(std::filesystem::exists(directory / "q8_0.gguf"));
}

// Row 128. llama.cpp builds a mixture of experts whenever expert_count > 0 and asserts
// expert_used_count == 0 without experts.
TEST(GgufModel, ExpertsInTheMetadataOfADenseFileAreRefused) {
  expect_refused(
      with_metadata({{"llama.expert_count", std::uint32_t{8}},
                     {"llama.expert_used_count", std::uint32_t{2}}}),
      {"metadata \"llama.expert_count\" is u32 8", "mixture of experts", "FFN tensors are dense"});
  expect_refused(with_metadata({{"llama.expert_used_count", std::uint32_t{2}}}),
                 {"\"llama.expert_used_count\" is u32 2"});
  expect_refused(with_metadata({{"llama.expert_count", std::int32_t{-1}}}),
                 {"\"llama.expert_count\" is i32 -1"});
  EXPECT_TRUE(loads(with_metadata(
      {{"llama.expert_count", std::uint32_t{0}}, {"llama.expert_used_count", std::uint32_t{0}}})));
}

// Row 129. llama.cpp sizes token_embd (and output) by its vocabulary's token count.
TEST(GgufModel, ATokenizerOfAnotherSizeThanTheEmbeddingIsRefused) {
  const auto tokens = [](std::size_t n) {
    GgufValue::Array pieces;
    for (std::size_t i = 0; i < n; ++i) pieces.emplace_back(concat("t", i));
    return GgufValue::array(GgufType::string, std::move(pieces));
  };
  // TinyLlamaFile's embedding has 50 rows.
  expect_refused(
      with_metadata({{"tokenizer.ggml.tokens", tokens(40)}}),
      {"\"tokenizer.ggml.tokens\" holds 40 tokens", "tensor \"token_embd.weight\" has 50 rows"});
  expect_refused(with_metadata({{"tokenizer.ggml.tokens", tokens(51)}}), {"holds 51 tokens"});
  expect_refused(with_metadata({{"tokenizer.ggml.tokens", "a b c"}}),
                 {"\"tokenizer.ggml.tokens\" is string", "not an array"});
  expect_refused(
      with_metadata({{"tokenizer.ggml.model", "none"}, {"llama.vocab_size", std::uint32_t{60}}}),
      {"\"llama.vocab_size\" is u32 60", "has 50 rows"});
  EXPECT_TRUE(loads(with_metadata({{"tokenizer.ggml.tokens", tokens(50)}})));
  EXPECT_TRUE(loads(
      with_metadata({{"tokenizer.ggml.model", "none"}, {"llama.vocab_size", std::uint32_t{50}}})));
}

// ---- text from the file in messages (reliability row 126) ---------------------------------------

TEST(GgufText, ControlsAndBytesThatAreNotUtf8AreEscapedAndTheRestIsKept) {
  EXPECT_EQ(quote_file_text("llama"), "\"llama\"");
  EXPECT_EQ(quote_file_text("\x1b[2Jx\x07\x7f\n"), "\"\\x1b[2Jx\\x07\\x7f\\x0a\"");
  EXPECT_EQ(quote_file_text("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(escape_file_text("a\"b\\c"), "a\"b\\\\c");  // unquoted: a quote mark is plain
  // UTF-8 letters stay; C1 controls (U+009B is CSI) and the bidirectional overrides do not.
  EXPECT_EQ(escape_file_text("\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80"),
            "\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80");
  EXPECT_EQ(escape_file_text("a\xc2\x9b"
                             "1m\xe2\x80\xae"),
            "a\\xc2\\x9b1m\\xe2\\x80\\xae");
  // Not UTF-8: a stray continuation, an overlong '/', a surrogate, past U+10FFFF, cut short.
  EXPECT_EQ(escape_file_text("\x80"), "\\x80");
  EXPECT_EQ(escape_file_text("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(escape_file_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(escape_file_text("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(escape_file_text("ab\xe2\x96"), "ab\\xe2\\x96");
  EXPECT_EQ(escape_file_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(GgufValue("x\x1b[0m\xff").describe(), "\"x\\x1b[0m\\xff\"");
}

/// Whether `text` holds a byte a terminal acts on (a C0 control or DEL).
bool has_control(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b < 0x20 || b == 0x7f;
  });
}

/// `attempt` must throw an Error whose message holds `part` and no control byte.
template <class Attempt>
void expect_escaped(const Attempt& attempt, std::string_view part) {
  try {
    attempt();
    ADD_FAILURE() << "no throw; expected " << part;
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), part));
    EXPECT_FALSE(has_control(error.what())) << error.what();
  }
}

TEST(GgufText, EveryMessageQuotesWhatTheFileSaysEscaped) {
  TemporaryDirectory directory;
  {
    TinyLlamaFile tiny;
    tiny.metadata[0].second = "\x1b[2J\x1b[31mllama";
    tiny.save(directory / "a.gguf");
    expect_escaped([&] { (void)read_gguf_config(GgufFile(directory / "a.gguf")); },
                   "general.architecture \"\\x1b[2J\\x1b[31mllama\" is not one dissect builds");
  }
  {
    TinyLlamaFile tiny;
    tiny.tensors.push_back({"\x1b]0;pwned\x07", {4}, ""});
    tiny.save(directory / "b.gguf");
    expect_escaped([&] { (void)read_gguf_config(GgufFile(directory / "b.gguf")); },
                   "tensor \"\\x1b]0;pwned\\x07\" is not part of a llama model");
  }
  {
    TinyLlamaFile tiny = with_metadata({{"llama.rope.scaling.type", "\x1b[5mblink\xff"}});
    tiny.save(directory / "c.gguf");
    expect_escaped([&] { (void)read_gguf_config(GgufFile(directory / "c.gguf")); },
                   "is \"\\x1b[5mblink\\xff\": RoPE scaling");
  }
  // The parser's own messages: a key given twice, a bool of 2, a tensor past the end.
  expect_escaped(
      [] {
        GgufFile::from_bytes(Builder()
                                 .header(0, 2)
                                 .str("k\x1b")
                                 .put<std::uint32_t>(0)
                                 .put<std::uint8_t>(1)
                                 .str("k\x1b")
                                 .put<std::uint32_t>(0)
                                 .put<std::uint8_t>(1)
                                 .out);
      },
      "metadata key \"k\\x1b\" appears twice");
  expect_escaped(
      [] {
        GgufFile::from_bytes(Builder()
                                 .header(0, 1)
                                 .str("\x9b"
                                      "b")
                                 .put<std::uint32_t>(7)
                                 .put<std::uint8_t>(2)
                                 .out);
      },
      "metadata \"\\x9bb\" is a bool stored as 2");
  expect_escaped(
      [] { GgufFile::from_bytes(Builder().header(1, 0).tensor("t\x1b[K", {64}, 0, 0).pad().out); },
      "tensor \"t\\x1b[K\" (f32 [64], 256 bytes at data offset 0) runs past the end");
  // Asking for a name that is not there quotes the asker's text alike.
  const GgufFile blocks(blocks_path);
  expect_escaped([&] { (void)blocks.info("\x1b[2J"); }, "has no tensor \"\\x1b[2J\"");
  expect_escaped([&] { (void)blocks.require_string("\x1b[2J"); }, "has no metadata \"\\x1b[2J\"");
}

}  // namespace test_gguf
}  // namespace dissect
