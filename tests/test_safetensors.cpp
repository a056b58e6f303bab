// Tests for dissect/io/safetensors.hpp: bit-exact round trips (NaN payloads, −0, subnormals,
// Unicode metadata), dtype conversion on load, the layout save_safetensors writes, atomic
// writing, and — reliability catalog row 25 — one test per kind of corrupt file, each asserting
// the exception type and that the message names the file and the tensor or field.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "dissect/io/safetensors.hpp"
#include "support/io_testing.hpp"
#include "support/sanitizers.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_safetensors {

using testing::bytes_of;
using testing::contains;
using testing::safetensors_bytes;

/// Floats that catch any conversion that is not a plain copy: NaNs with payloads (quiet and
/// signalling, both signs), ±0, ±Inf, subnormals, the extremes, then random values.
std::vector<float> awkward_floats(std::size_t count, std::mt19937& engine) {
  std::vector<std::uint32_t> bits{0x7fc0'0001, 0xffc1'2345, 0x7f80'0001, 0xff80'7fff,
                                  0x8000'0000, 0x0000'0000, 0x7f80'0000, 0xff80'0000,
                                  0x0000'0001, 0x807f'ffff, 0x7f7f'ffff, 0x0080'0000};
  std::uniform_int_distribution<std::uint32_t> any;
  while (bits.size() < count) bits.push_back(any(engine));
  bits.resize(count);
  std::vector<float> values;
  for (std::uint32_t b : bits) values.push_back(std::bit_cast<float>(b));
  return values;
}

std::vector<double> awkward_doubles(std::size_t count, std::mt19937& engine) {
  std::vector<std::uint64_t> bits{
      0x7ff8'0000'0000'0001, 0xfff4'0000'dead'beef, 0x7ff0'0000'0000'0001, 0x8000'0000'0000'0000,
      0x0000'0000'0000'0001, 0x7fef'ffff'ffff'ffff, 0xfff0'0000'0000'0000, 0x000f'ffff'ffff'ffff};
  std::uniform_int_distribution<std::uint64_t> any;
  while (bits.size() < count) bits.push_back(any(engine));
  bits.resize(count);
  std::vector<double> values;
  for (std::uint64_t b : bits) values.push_back(std::bit_cast<double>(b));
  return values;
}

/// Bitwise equality of two ranges (== would call NaN unequal to itself).
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  /// `bytes` written to a file of its own; the path.
  std::filesystem::path file_with(const std::vector<std::byte>& bytes) {
    const auto path = directory_ / ("case" + std::to_string(files_++) + ".safetensors");
    testing::write_file(path, bytes);
    return path;
  }

  /// Asserts that opening `bytes` as a file throws Expected whose message names the file and
  /// holds `part`, and that the in-memory parser says the same about the same bytes.
  template <class Expected>
  void expect_refused(const std::vector<std::byte>& bytes, std::string_view part) {
    const auto path = file_with(bytes);
    try {
      SafetensorsFile file(path);
      ADD_FAILURE() << "opened a corrupt file; expected a message with: " << part;
    } catch (const Expected& error) {
      EXPECT_TRUE(contains(error.what(), path.string()));
      EXPECT_TRUE(contains(error.what(), part));
      try {
        SafetensorsFile::from_bytes(bytes, path);
        ADD_FAILURE() << "from_bytes accepted what the file constructor refused";
      } catch (const Expected& same) {
        EXPECT_STREQ(same.what(), error.what());
      }
    } catch (const std::exception& error) {
      ADD_FAILURE() << "wrong exception type; message: " << error.what();
    }
  }

  testing::TemporaryDirectory directory_;
  int files_ = 0;
};

// ---- round trips --------------------------------------------------------------------------------

TEST_F(SafetensorsTest, F32AndF64RoundTripBitExactlyWithMetadata) {
  std::mt19937 engine(25);
  const auto floats = awkward_floats(2 * 3 * 4, engine);
  const auto doubles = awkward_doubles(7, engine);
  const std::map<std::string, std::string> metadata{{"format", "pt"},
                                                    {"名前", "ünïcødé ✓ — \"quoted\"\n"}};
  const auto path = directory_ / "round.safetensors";
  const std::vector<SaveEntry> entries{
      {"layer.weight", {2, 3, 4}, std::span(floats)},
      {"layer.bias", {7}, std::span(doubles)},
      {"empty", {0, 5}, std::span<const float>()},
      {"scalar", {}, std::span(floats).first(1)},
  };
  save_safetensors(path, entries, metadata);

  const SafetensorsFile file(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), metadata);
  EXPECT_EQ(file.tensor_names(),
            (std::vector<std::string>{"empty", "layer.bias", "layer.weight", "scalar"}));
  EXPECT_TRUE(file.contains("layer.bias"));
  EXPECT_FALSE(file.contains("layer"));
  EXPECT_EQ(file.info("layer.weight").dtype, "F32");
  EXPECT_EQ(file.info("layer.weight").shape, (std::vector<index_t>{2, 3, 4}));
  EXPECT_EQ(file.info("layer.bias").dtype, "F64");
  EXPECT_TRUE(file.info("scalar").shape.empty());

  const auto weight = file.load<float, 3>("layer.weight");
  EXPECT_EQ(weight.shape(), (Shape<3>{2, 3, 4}));
  EXPECT_TRUE(same_bits(std::span(weight.data(), 24), floats));
  const auto bias = file.load<double, 1>("layer.bias");
  EXPECT_TRUE(same_bits(std::span(bias.data(), 7), doubles));
  EXPECT_EQ((file.load<float, 2>("empty").shape()), (Shape<2>{0, 5}));
  EXPECT_TRUE(same_bits(file.bytes("scalar"), std::as_bytes(std::span(floats).first(1))));

  // Zero-copy views of the same bits, pointing into the mapped file.
  const auto view = file.view<3>("layer.weight");
  EXPECT_TRUE(same_bits(std::span(view.data(), 24), floats));
  EXPECT_EQ(static_cast<const void*>(view.data()),
            static_cast<const void*>(file.bytes("layer.weight").data()));
  const auto bias_view = file.view<1, double>("layer.bias");
  EXPECT_TRUE(same_bits(std::span(bias_view.data(), 7), doubles));
}

TEST_F(SafetensorsTest, TensorsComeInFileOrderAndTheLayoutIsAligned) {
  const std::vector<float> f(6, 1.0f);
  const std::vector<double> d(3, 2.0);
  const auto path = directory_ / "layout.safetensors";
  const std::vector<SaveEntry> entries{{"c.half", {3}, std::span(f).first(3), SaveDtype::f16},
                                       {"b.float", {5}, std::span(f).first(5)},
                                       {"a.brain", {1}, std::span(f).first(1), SaveDtype::bf16},
                                       {"z.double", {3}, std::span(d)}};
  save_safetensors(path, entries, {{"k", "v"}});

  const auto raw = testing::read_file(path);
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, raw.data(), 8);
  EXPECT_EQ(header_length % 8, 0u) << "the data section starts 8-byte aligned";
  const std::string header(reinterpret_cast<const char*>(raw.data()) + 8, header_length);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, nlohmann::json::parse(header).dump().size())
      << "padded with spaces only";
  EXPECT_TRUE(header.starts_with("{\"__metadata__\":")) << "keys sorted";

  // Widest first, then by name; each aligned to its own element size.
  const SafetensorsFile file(path);
  std::vector<std::string> order;
  for (const TensorInfo& info : file.tensors()) {
    order.push_back(info.name);
    const index_t size = info.dtype == "F64" ? 8 : info.dtype == "F32" ? 4 : 2;
    EXPECT_EQ((8 + static_cast<index_t>(header_length) + info.begin) % size, 0) << info.name;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"z.double", "b.float", "a.brain", "c.half"}));
  EXPECT_EQ(file.info("a.brain").dtype, "BF16");
  EXPECT_EQ(file.info("c.half").dtype, "F16");
}

TEST_F(SafetensorsTest, HalfFormatsRoundToNearestEvenAndWidenExactly) {
  std::mt19937 engine(3);
  const auto floats = awkward_floats(64, engine);
  const auto doubles = awkward_doubles(64, engine);
  const auto path = directory_ / "half.safetensors";
  const std::vector<SaveEntry> entries{
      {"f16", {8, 8}, std::span(floats), SaveDtype::f16},
      {"bf16", {64}, std::span(floats), SaveDtype::bf16},
      {"f16_from_double", {64}, std::span(doubles), SaveDtype::f16},
      {"bf16_from_double", {64}, std::span(doubles), SaveDtype::bf16},
  };
  save_safetensors(path, entries);
  const SafetensorsFile file(path);
  const auto f16 = file.load<float, 2>("f16");
  const auto bf16 = file.load<double, 1>("bf16");  // widened to float, then exactly to double
  const auto f16d = file.load<double, 1>("f16_from_double");
  const auto bf16d = file.load<float, 1>("bf16_from_double");
  for (std::size_t i = 0; i < 64; ++i) {
    SCOPED_TRACE(i);
    const float expected_f16 = fp16_to_float(float_to_fp16(floats[i]));
    const float expected_bf16 = bf16_to_float(float_to_bf16(floats[i]));
    if (std::isnan(floats[i])) {
      EXPECT_TRUE(std::isnan(f16.data()[i]) && std::isnan(bf16.data()[i]));
      continue;
    }
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f16.data()[i]),
              std::bit_cast<std::uint32_t>(expected_f16));
    EXPECT_EQ(std::bit_cast<std::uint64_t>(bf16.data()[i]),
              std::bit_cast<std::uint64_t>(static_cast<double>(expected_bf16)));
    if (!std::isnan(doubles[i])) {
      EXPECT_EQ(f16d.data()[i], fp16_to_float(double_to_fp16(doubles[i])));
      EXPECT_EQ(bf16d.data()[i], bf16_to_float(double_to_bf16(doubles[i])));
    }
  }
}

TEST_F(SafetensorsTest, LoadConvertsBetweenFloatAndDouble) {
  const std::vector<float> floats{1.5f, -0.0f, 0x1p-149f, 3.4e38f};
  const std::vector<double> doubles{0.1, -1e300, 1e-320, 2.5};
  const auto path = directory_ / "convert.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"f", {4}, std::span(floats)},
                                                {"d", {2, 2}, std::span(doubles)}});
  const SafetensorsFile file(path);
  const auto widened = file.load<double, 1>("f");
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(widened.data()[i]),
              std::bit_cast<std::uint64_t>(static_cast<double>(floats[i])));
  }
  const auto narrowed = file.load<float, 2>("d");
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(narrowed.data()[i]),
              std::bit_cast<std::uint32_t>(static_cast<float>(doubles[i])));
  }
  // load_into writes straight into an existing buffer.
  Tensor<double, 2> target({2, 2});
  load_into(file, "d", target.view());
  EXPECT_TRUE(same_bits(std::span(target.data(), 4), doubles));
}

TEST_F(SafetensorsTest, LoadBlockIntoReadsOneSliceOfARowMajorTensor) {
  // w [4, 5] with w[r][c] = 10·r + c, stored as BF16 (exact for these integers) and as F64; b [4].
  std::vector<double> values(20);
  for (int i = 0; i < 20; ++i) values[static_cast<std::size_t>(i)] = 10 * (i / 5) + i % 5;
  const std::vector<double> bias{1, 2, 3, 4};
  const auto path = directory_ / "block.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"w16", {4, 5}, std::span(values), SaveDtype::bf16},
                                                {"w64", {4, 5}, std::span(values)},
                                                {"b", {4}, std::span(bias)}});
  const SafetensorsFile file(path);
  for (const char* name : {"w16", "w64"}) {
    Tensor<float, 2> block({2, 3});
    load_block_into(file, name, 1, 2, 2, 3, block.view());  // rows 1–2, columns 2–4
    EXPECT_EQ(std::vector<float>(block.data(), block.data() + 6),
              (std::vector<float>{12, 13, 14, 22, 23, 24}))
        << name;
  }
  Tensor<double, 2> tail({2, 1});
  load_block_into(file, "b", 2, 2, 0, 1, tail.view());  // a 1-D tensor reads as [n, 1]
  EXPECT_EQ(tail(0, 0), 3.0);
  EXPECT_EQ(tail(1, 0), 4.0);
  Tensor<float, 2> none({0, 3});
  load_block_into(file, "w64", 4, 0, 2, 3, none.view());  // an empty block at the end is valid

  Tensor<float, 2> target({2, 3});
  target.fill(7.0f);
  EXPECT_THROW_WITH(load_block_into(file, "w64", 3, 2, 0, 3, target.view()), ShapeError,
                    "load_block_into: tensor \"w64\" in ");
  EXPECT_THROW_WITH(load_block_into(file, "w64", 0, 2, 3, 3, target.view()), ShapeError,
                    "has shape [4, 5]; rows [0, 0 + 2), columns [3, 3 + 3)");
  EXPECT_THROW_WITH(load_block_into(file, "w64", -1, 2, 0, 3, target.view()), ShapeError,
                    "must lie inside");
  EXPECT_THROW_WITH(load_block_into(file, "w64", 0, 3, 0, 3, target.view()), ShapeError,
                    "into a target [2, 3]");
  EXPECT_EQ(target(0, 0), 7.0f) << "a refused load_block_into writes nothing";
}

TEST_F(SafetensorsTest, AFileCanBeMovedAndItsViewsStayValid) {
  const std::vector<float> values{1, 2, 3};
  const auto path = directory_ / "move.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"x", {3}, std::span(values)}});
  SafetensorsFile first(path);
  const auto view = first.view<1>("x");
  SafetensorsFile second(std::move(first));
  EXPECT_EQ(view(2), 3.0f);
  EXPECT_EQ((second.load<float, 1>("x")(1)), 2.0f);
  SafetensorsFile third = SafetensorsFile::from_bytes(testing::read_file(path), "copy");
  third = std::move(second);  // the old bytes are released, the moved-in ones kept
  EXPECT_EQ(view(0), 1.0f);
  EXPECT_EQ(third.path(), path);
  static_assert(!std::is_copy_constructible_v<SafetensorsFile>);
}

TEST_F(SafetensorsTest, SaveEntriesFromTensorsAndViews) {
  Tensor<float, 2> weight({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor<double, 1> bias({2}, {0.5, -0.5});
  const auto path = directory_ / "tensors.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"weight", weight.view()},
                                                {"bias", bias},
                                                {"bias16", bias.cview(), SaveDtype::bf16}});
  const SafetensorsFile file(path);
  EXPECT_TENSOR_EQ((file.load<float, 2>("weight")), weight);
  EXPECT_TENSOR_EQ((file.load<double, 1>("bias")), bias);
  EXPECT_EQ(file.info("bias16").dtype, "BF16");
  EXPECT_EQ(save_dtype_name(SaveDtype::bf16), "BF16");
}

// ---- valid files of unusual shape ---------------------------------------------------------------

TEST_F(SafetensorsTest, UnusualButValidFilesOpen) {
  // No tensors at all; empty tensors sharing an offset; a header padded with spaces; a header
  // length that puts F32 data off its alignment (load still works, view refuses).
  EXPECT_TRUE(SafetensorsFile(file_with(safetensors_bytes("{}"))).tensors().empty());
  const SafetensorsFile empties(file_with(
      safetensors_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                        R"("b":{"dtype":"I64","shape":[3,0],"data_offsets":[0,0]}}    )")));
  EXPECT_EQ(empties.tensors().size(), 2u);
  EXPECT_EQ((empties.load<float, 1>("a").size()), 0);

  const std::vector<float> values{1.0f, -2.0f};
  const SafetensorsFile odd(file_with(safetensors_bytes(
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )", bytes_of(values))));
  EXPECT_EQ((odd.load<float, 1>("x")(1)), -2.0f);
  EXPECT_THROW_WITH(odd.view<1>("x"), Error, "is not 4-byte aligned in memory: use load()");
}

// ---- using a file wrongly -----------------------------------------------------------------------

TEST_F(SafetensorsTest, AskingForWhatIsNotThereOrCannotBeConverted) {
  const std::vector<std::int64_t> ids{1, 2, 3};
  const std::vector<float> values(6, 0.5f);
  const auto path =
      file_with(safetensors_bytes(R"({"ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},)"
                                  R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[24,48]},)"
                                  R"("h":{"dtype":"BF16","shape":[2],"data_offsets":[48,52]}}    )",
                                  [&] {
                                    auto data = bytes_of(ids);
                                    const auto more = bytes_of(values);
                                    data.insert(data.end(), more.begin(), more.end());
                                    data.resize(data.size() + 4);
                                    return data;
                                  }()));
  const SafetensorsFile file(path);
  const std::string name = path.string();
  EXPECT_THROW_WITH(file.info("missing"), Error, name + " has no tensor \"missing\"");
  EXPECT_THROW_WITH((file.load<float, 1>("missing")), Error, "has no tensor \"missing\"");
  EXPECT_THROW_WITH((file.load<float, 1>("ids")), Error,
                    "tensor \"ids\" in " + name + " is I64; dissect reads F32, F64, F16 and BF16");
  EXPECT_THROW_WITH((file.load<float, 3>("w")), ShapeError,
                    "tensor \"w\" in " + name + " has shape [2, 3] (rank 2), asked for rank 3");
  EXPECT_THROW_WITH(file.view<1>("h"), Error, "is BF16, a view of float needs F32: use load()");
  EXPECT_THROW_WITH((file.view<2, double>("w")), Error, "a view of double needs F64");
  EXPECT_EQ(file.bytes("ids").size(), 24u);

  Tensor<float, 2> target({3, 2});
  target.fill(7.0f);
  EXPECT_THROW_WITH(load_into(file, "w", target.view()), ShapeError,
                    "tensor \"w\" in " + name + " has shape [2, 3], the target has shape [3, 2]");
  EXPECT_EQ(target(0, 0), 7.0f) << "a refused load_into writes nothing";
}

TEST_F(SafetensorsTest, FilesThatCannotBeOpened) {
  EXPECT_THROW_WITH(SafetensorsFile(directory_ / "absent.safetensors"), Error,
                    "cannot open " + (directory_ / "absent.safetensors").string() +
                        ": No such file or directory");
  EXPECT_THROW_WITH(SafetensorsFile(directory_.path()), Error, "not a regular file");
}

// ---- writing ------------------------------------------------------------------------------------

/// Whether `directory` holds any temporary file of save_safetensors.
bool leaves_temporaries(const std::filesystem::path& directory) {
  for (const auto& item : std::filesystem::directory_iterator(directory)) {
    if (item.path().string().find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

TEST_F(SafetensorsTest, SavingReplacesAFileWholeAndLeavesNoTemporary) {
  const std::vector<float> old_values{1, 2}, new_values{3, 4, 5};
  const auto path = directory_ / "model.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"x", {2}, std::span(old_values)}});
  save_safetensors(path, std::vector<SaveEntry>{{"y", {3}, std::span(new_values)}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.tensor_names(), std::vector<std::string>{"y"});
  EXPECT_FALSE(leaves_temporaries(directory_.path()));
}

TEST_F(SafetensorsTest, RefusedSavesNameTheProblemAndKeepTheOldFile) {
  const std::vector<float> values{1, 2, 3, 4};
  const auto path = directory_ / "keep.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"kept", {4}, std::span(values)}});
  const auto before = testing::read_file(path);
  const auto save = [&](std::vector<SaveEntry> entries,
                        std::map<std::string, std::string> metadata = {}) {
    save_safetensors(path, entries, metadata);
  };
  EXPECT_THROW_WITH(save({{"a", {4}, std::span(values)}, {"a", {4}, std::span(values)}}), Error,
                    "tensor \"a\" appears twice");
  EXPECT_THROW_WITH(save({{"__metadata__", {4}, std::span(values)}}), Error, "reserved");
  EXPECT_THROW_WITH(save({{"a", {3}, std::span(values)}}), ShapeError,
                    "tensor \"a\": 4 values for shape [3] (3 elements)");
  EXPECT_THROW_WITH(save({{"a", {-1, 4}, std::span(values)}}), ShapeError,
                    "negative dimension -1 at axis 0 of shape [-1, 4]");
  EXPECT_THROW_WITH(save({{"a", {index_t{1} << 62, 4}, std::span(values)}}), OverflowError,
                    "tensor \"a\": element count");
  EXPECT_THROW_WITH(save({{"a", {4}, std::span(values), static_cast<SaveDtype>(9)}}), ConfigError,
                    "SaveDtype(9) is out of range");
  EXPECT_THROW_WITH(save({{"bad\xff", {4}, std::span(values)}}), Error, "is not valid UTF-8");
  EXPECT_THROW_WITH(save({{"a", {4}, std::span(values)}}, {{"k", "\xc3"}}), Error,
                    "the metadata value of \"k\" is not valid UTF-8");
  EXPECT_TRUE(same_bits(testing::read_file(path), before));
  EXPECT_FALSE(leaves_temporaries(directory_.path()));
}

TEST_F(SafetensorsTest, IoFailuresNameThePathAndTheSystemsReason) {
  const std::vector<float> values{1, 2};
  const std::vector<SaveEntry> entries{{"x", {2}, std::span(values)}};
  const auto nowhere = directory_ / "no" / "such" / "dir.safetensors";
  EXPECT_THROW_WITH(save_safetensors(nowhere, entries), Error, "No such file or directory");
  EXPECT_THROW_WITH(save_safetensors(nowhere, entries), Error, nowhere.string());

  // The target is a directory that is not empty: the rename fails, the directory stays.
  const auto occupied = directory_ / "occupied";
  std::filesystem::create_directory(occupied);
  testing::write_file(occupied / "inside", bytes_of(values));
  EXPECT_THROW_WITH(save_safetensors(occupied, entries), Error,
                    "save_safetensors: cannot rename the new file onto " + occupied.string());
  EXPECT_TRUE(std::filesystem::exists(occupied / "inside"));
  EXPECT_FALSE(leaves_temporaries(directory_.path()));
}

TEST_F(SafetensorsTest, AWriteThatFailsHalfwayKeepsTheOldFile) {
  // A file-size limit makes write() fail with EFBIG after 64 KiB (SIGXFSZ ignored, so the
  // process survives to see the error) — a disk filling up, in miniature.
  std::vector<float> big(100'000, 1.0f);
  const std::vector<float> small{9.0f};
  const auto path = directory_ / "full.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"small", {1}, std::span(small)}});
  const auto before = testing::read_file(path);

  struct ::rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct ::rlimit limited = saved;
  limited.rlim_cur = 1 << 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    save_safetensors(path, std::vector<SaveEntry>{{"big", {100'000}, std::span(big)}});
  } catch (const Error& error) {
    message = error.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(
      contains(message, "save_safetensors: cannot write " + path.string() + ": File too large"));
  EXPECT_TRUE(same_bits(testing::read_file(path), before));
  EXPECT_FALSE(leaves_temporaries(directory_.path()));
}

// ---- corrupt files (reliability row 25): one test per kind
// ----------------------------------------

/// A valid entry's text for tensor `name`: F32 of `count` elements at [begin, begin + 4·count).
std::string f32_entry(const std::string& name, int begin, int count) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(count) +
         "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(begin + 4 * count) +
         "]}";
}

std::vector<std::byte> zeros(std::size_t count) {
  return std::vector<std::byte>(count);
}

/// A file of one tensor "w" whose fields are the JSON texts given, and `data` zero bytes.
std::vector<std::byte> tensor_w(const std::string& dtype, const std::string& shape,
                                const std::string& offsets, std::size_t data) {
  return safetensors_bytes(
      "{\"w\":{\"dtype\":" + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}}",
      zeros(data));
}

TEST_F(SafetensorsTest, CorruptShorterThanTheLengthField) {
  expect_refused<FormatError>({}, "the file is 0 bytes, too short for the 8-byte header length");
  expect_refused<FormatError>(zeros(5), "the file is 5 bytes");
}

TEST_F(SafetensorsTest, CorruptHeaderLengthPastTheEnd) {
  expect_refused<FormatError>(safetensors_bytes("{}", {}, 3),
                              "header length 3 runs past the end of the 10-byte file");
  expect_refused<FormatError>(safetensors_bytes("{}", {}, ~std::uint64_t{0}),
                              "header length 18446744073709551615 exceeds the limit");
}

TEST_F(SafetensorsTest, CorruptHeaderLengthBeyondTheCap) {
  expect_refused<FormatError>(safetensors_bytes("{}", {}, 100'000'001),
                              "header length 100000001 exceeds the limit of 100,000,000 bytes");
}

TEST_F(SafetensorsTest, CorruptInvalidJson) {
  expect_refused<FormatError>(safetensors_bytes("{\"a\": "), "the header is not valid JSON");
  expect_refused<FormatError>(safetensors_bytes(""), "the header is not valid JSON");
  expect_refused<FormatError>(safetensors_bytes("{} {}"), "the header is not valid JSON");
  expect_refused<FormatError>(safetensors_bytes("{\"\xff\":1}"), "the header is not valid JSON");
}

TEST_F(SafetensorsTest, CorruptHeaderNotAnObject) {
  expect_refused<FormatError>(safetensors_bytes("[1, 2]"),
                              "the header is an array, not a JSON object");
  expect_refused<FormatError>(safetensors_bytes("\"x\""), "the header is a string");
}

TEST_F(SafetensorsTest, CorruptEntryNotAnObject) {
  expect_refused<FormatError>(safetensors_bytes(R"({"w": [1, 2]})"),
                              "tensor \"w\" is an array, not an object");
}

TEST_F(SafetensorsTest, CorruptEmptyOrNulTensorName) {  // row 134
  // An empty name names no parameter; a NUL ends the name for every C reader ("a\0b" is "a"),
  // so two readers of one file would see two different names. Both refused, the NUL shown.
  expect_refused<FormatError>(
      safetensors_bytes(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", zeros(4)),
      ": a tensor has an empty name");
  expect_refused<FormatError>(
      safetensors_bytes(R"({"a\u0000b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                        zeros(4)),
      ": tensor \"a\\u0000b\" has a NUL byte in its name (at byte 1)");
  // What a reader refuses is not written.
  const std::vector<float> values{1, 2};
  const auto path = directory_ / "names.safetensors";
  EXPECT_THROW_WITH(save_safetensors(path, std::vector<SaveEntry>{{"", {2}, std::span(values)}}),
                    FormatError, "save_safetensors: a tensor has an empty name");
  EXPECT_THROW_WITH(
      save_safetensors(path,
                       std::vector<SaveEntry>{{std::string("w\0x", 3), {2}, std::span(values)}}),
      FormatError, "save_safetensors: tensor \"w\\u0000x\" has a NUL byte in its name");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(SafetensorsTest, CorruptEntryMissingAField) {
  expect_refused<FormatError>(
      safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", zeros(4)),
      "tensor \"w\" has no \"dtype\"");
  expect_refused<FormatError>(
      safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", zeros(4)),
      "tensor \"w\" has no \"shape\"");
  expect_refused<FormatError>(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", zeros(4)),
                              "tensor \"w\" has no \"data_offsets\"");
}

TEST_F(SafetensorsTest, CorruptEntryFieldOfTheWrongType) {
  expect_refused<FormatError>(tensor_w("32", "[2]", "[0,8]", 8),
                              "tensor \"w\": \"dtype\" is the number 32, not a string");
  expect_refused<FormatError>(tensor_w("\"F32\"", "\"2\"", "[0,8]", 8),
                              "tensor \"w\": \"shape\" is a string, not an array");
  expect_refused<FormatError>(
      tensor_w("\"F32\"", "[2.0]", "[0,8]", 8),
      "tensor \"w\": shape[0] is the number 2.0, not a non-negative integer");
  expect_refused<FormatError>(tensor_w("\"F32\"", "[1, null]", "[0,8]", 8),
                              "tensor \"w\": shape[1] is null");
  expect_refused<FormatError>(tensor_w("\"F32\"", "[2]", "{\"begin\":0}", 8),
                              "tensor \"w\": \"data_offsets\" is an object, not [begin, end]");
  expect_refused<FormatError>(tensor_w("\"F32\"", "[2]", "[0,4,8]", 8),
                              "\"data_offsets\" is an array of 3, not [begin, end]");
  expect_refused<FormatError>(tensor_w("\"F32\"", "[2]", "[\"0\",8]", 8),
                              "tensor \"w\": data_offsets[0] is a string");
}

TEST_F(SafetensorsTest, CorruptUnknownDtype) {
  expect_refused<FormatError>(tensor_w("\"F99\"", "[1]", "[0,4]", 4),
                              "tensor \"w\": unknown dtype \"F99\"");
}

TEST_F(SafetensorsTest, CorruptNegativeDimensionOrOffset) {
  expect_refused<FormatError>(tensor_w("\"F32\"", "[2,-3]", "[0,24]", 24),
                              "tensor \"w\": shape[1] is negative (-3)");
  expect_refused<FormatError>(tensor_w("\"F32\"", "[1]", "[-4,0]", 4),
                              "tensor \"w\": data_offsets[0] is negative (-4)");
}

TEST_F(SafetensorsTest, CorruptSizesBeyondInt64) {
  // 2⁶² · 4 elements overflow the count; 2⁶¹ F64 elements overflow the byte size; 2⁶³ is no
  // int64 at all.
  expect_refused<OverflowError>(
      tensor_w("\"F32\"", "[4611686018427387904,4]", "[0,4]", 4),
      "tensor \"w\": size of F32 [4611686018427387904, 4]: overflows int64");
  expect_refused<OverflowError>(tensor_w("\"F64\"", "[2305843009213693952]", "[0,8]", 8),
                                "tensor \"w\": size of F64 [2305843009213693952]: overflows int64");
  expect_refused<FormatError>(tensor_w("\"F32\"", "[9223372036854775808]", "[0,4]", 4),
                              "tensor \"w\": shape[0] 9223372036854775808 does not fit int64");
  // With an empty axis, any other extent is fine: the tensor holds nothing.
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(safetensors_bytes(
      R"({"w":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})")));
}

TEST_F(SafetensorsTest, CorruptEndBeforeBegin) {
  expect_refused<FormatError>(tensor_w("\"F32\"", "[1]", "[8,4]", 8),
                              "tensor \"w\": data_offsets [8, 4] end before they begin");
}

TEST_F(SafetensorsTest, CorruptOffsetsOutsideTheDataSection) {
  expect_refused<FormatError>(
      tensor_w("\"F32\"", "[2]", "[0,8]", 4),
      "tensor \"w\": data_offsets [0, 8] reach past the data section (4 bytes)");
  expect_refused<FormatError>(
      tensor_w("\"F32\"", "[1]", "[9223372036854775803,9223372036854775807]", 4),
      "reach past the data section");
}

TEST_F(SafetensorsTest, CorruptByteSpanOtherThanShapeTimesDtype) {
  expect_refused<FormatError>(
      tensor_w("\"F32\"", "[2,2]", "[0,12]", 12),
      "tensor \"w\": data_offsets [0, 12] hold 12 bytes, but F32 [2, 2] needs 16");
  expect_refused<FormatError>(tensor_w("\"BF16\"", "[3]", "[0,8]", 8),
                              "hold 8 bytes, but BF16 [3] needs 6");
}

TEST_F(SafetensorsTest, CorruptOverlappingTensors) {
  expect_refused<FormatError>(
      safetensors_bytes("{" + f32_entry("a", 0, 4) + "," + f32_entry("b", 8, 4) + "}", zeros(24)),
      "tensors \"a\" [0, 16) and \"b\" [8, 24) overlap");
  // An empty tensor inside another's range shares no byte, but the format has no place for it.
  expect_refused<FormatError>(
      safetensors_bytes("{" + f32_entry("a", 0, 2) + "," + f32_entry("e", 4, 0) + "}", zeros(8)),
      "tensors \"a\" [0, 8) and \"e\" [4, 4) overlap");
}

TEST_F(SafetensorsTest, CorruptGapBetweenTensors) {
  expect_refused<FormatError>(
      safetensors_bytes("{" + f32_entry("a", 0, 1) + "," + f32_entry("b", 8, 1) + "}", zeros(12)),
      "bytes [4, 8) of the data section belong to no tensor (after \"a\")");
  expect_refused<FormatError>(safetensors_bytes("{" + f32_entry("b", 4, 1) + "}", zeros(8)),
                              "bytes [0, 4) of the data section belong to no tensor");
}

TEST_F(SafetensorsTest, CorruptTrailingBytes) {
  expect_refused<FormatError>(safetensors_bytes("{" + f32_entry("a", 0, 1) + "}", zeros(7)),
                              "bytes [4, 7) of the data section belong to no tensor (after \"a\")");
  expect_refused<FormatError>(safetensors_bytes("{}", zeros(1)),
                              "bytes [0, 1) of the data section belong to no tensor");
}

TEST_F(SafetensorsTest, CorruptDuplicateNames) {
  expect_refused<FormatError>(
      safetensors_bytes("{" + f32_entry("a", 0, 1) + "," + f32_entry("a", 4, 1) + "}", zeros(8)),
      "the header: key \"a\" appears twice");
  expect_refused<FormatError>(
      safetensors_bytes(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})",
                        zeros(4)),
      "key \"dtype\" appears twice (in \"a\")");
  expect_refused<FormatError>(safetensors_bytes(R"({"__metadata__":{"k":"1","k":"2"}})"),
                              "key \"k\" appears twice (in \"__metadata__\")");
}

TEST_F(SafetensorsTest, CorruptMetadata) {
  expect_refused<FormatError>(safetensors_bytes(R"({"__metadata__":{"epoch":3}})"),
                              "__metadata__ \"epoch\" is the number 3, not a string");
  expect_refused<FormatError>(safetensors_bytes(R"({"__metadata__":["a"]})"),
                              "\"__metadata__\" is an array, not an object");
}

// ---- size (issue 24): the header check is O(n log n) in the tensor count -----------------------

// A hostile header may list a million tensors within the 100 MB cap. nlohmann's callback parser
// made that quadratic (10,000 tensors took 0.5 s, 40,000 up to 35 s, a million never ended); now
// every key costs one map lookup. Sanitizers and -O0 builds check a smaller header. CPU time, not
// wall time, so a busy machine does not fail the test.
TEST_F(SafetensorsTest, AMillionTensorsParseInSeconds) {
#if defined(DISSECT_TEST_SANITIZED)
  // Unoptimised and instrumented (the asan preset builds at -O0): a quadratic parse would still
  // take ~50 s here, a linear one takes ~10.
  constexpr int count = 100'000;
  constexpr double limit_seconds = 20;
#elif !defined(NDEBUG)
  constexpr int count = 50'000;
  constexpr double limit_seconds = 20;
#else
  constexpr int count = 1'000'000;
  constexpr double limit_seconds = 5;
#endif
  const auto header_of = [](int tensors, const std::string& last_name) {
    std::string header = "{";
    header.reserve(static_cast<std::size_t>(tensors) * 72);
    for (int i = 0; i < tensors; ++i) {
      header += i == 0 ? "" : ",";
      const std::string name =
          i + 1 < tensors ? std::string("t").append(std::to_string(i)) : last_name;
      header += f32_entry(name, 4 * i, 1);
    }
    return header + "}";
  };
  auto bytes = safetensors_bytes(header_of(count, "last"), zeros(4 * std::size_t{count}));
  const std::clock_t start = std::clock();
  const auto file = SafetensorsFile::from_bytes(std::move(bytes), "many.safetensors");
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  EXPECT_LT(seconds, limit_seconds) << count << " tensors";
  ASSERT_EQ(file.tensors().size(), std::size_t{count});
  EXPECT_EQ(file.tensors().back().name, "last");
  EXPECT_EQ(file.info("t12345").begin, 4 * 12345);
  std::printf("[ info     ] %d tensors parsed in %.2f s of CPU time\n", count, seconds);

  // The checks still see a repeat or an overlap between the first and the last of many tensors.
  const int some = count / 10;
  expect_refused<FormatError>(
      safetensors_bytes(header_of(some, "t0"), zeros(4 * std::size_t(some))),
      "the header: key \"t0\" appears twice");
  std::string overlapping = header_of(some, "last");  // "last" moved onto the bytes of "t0"
  const std::string last_offsets =
      "[" + std::to_string(4 * (some - 1)) + "," + std::to_string(4 * some) + "]";
  overlapping.replace(overlapping.rfind(last_offsets), last_offsets.size(), "[0,4]");
  expect_refused<FormatError>(safetensors_bytes(overlapping, zeros(4 * std::size_t(some))),
                              "tensors \"last\" [0, 4) and \"t0\" [0, 4) overlap");
}

}  // namespace test_safetensors
}  // namespace dissect
