// File fuzz for dissect/io/safetensors.hpp (reliability row 25): 50,000 seeded mutations of a
// few valid files — bit flips, byte replacements, truncations, appended bytes, header length
// edits and edits of the JSON's tokens (numbers, dtypes, punctuation, repeated keys, a tensor
// entered twice). Each mutated file is parsed from memory (from_bytes runs the same parser as
// the file constructor, and an exactly sized buffer lets AddressSanitizer see any read past the
// end), then every tensor is loaded at every rank and viewed. Each step either succeeds, with
// values that are exactly the bytes the header points to, or throws dissect::Error; anything
// else fails the test.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "dissect/io/safetensors.hpp"
#include "support/io_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_safetensors_fuzz {

using Bytes = std::vector<std::byte>;

/// The valid files the mutations start from: every dtype dissect converts, integer dtypes it
/// does not, empty tensors, a scalar, a rank-4 tensor, and metadata.
std::vector<Bytes> seed_files() {
  testing::TemporaryDirectory directory;
  const std::vector<float> floats{1.5f, -0.0f, 3e-41f, 65504.0f, -2.25f, 7.0f, 0.1f, -9.0f};
  const std::vector<double> doubles{0.1, -1e300, 5e-324, 2.0};
  const auto path = directory / "mixed.safetensors";
  save_safetensors(
      path,
      std::vector<SaveEntry>{{"h.0.weight", {2, 3}, std::span(floats).first(6)},
                             {"h.0.bias", {4}, std::span(doubles)},
                             {"half", {2, 2}, std::span(floats).first(4), SaveDtype::f16},
                             {"brain", {8}, std::span(floats), SaveDtype::bf16},
                             {"cube", {1, 2, 2, 2}, std::span(floats)},
                             {"none", {0, 3}, std::span<const float>()}},
      {{"format", "pt"}, {"note", "ünïcode"}});
  std::vector<Bytes> files{testing::read_file(path)};
  const std::vector<std::int64_t> ids{3, 1, 4};
  Bytes data = testing::bytes_of(ids);
  data.push_back(std::byte{7});
  for (int i = 0; i < 4; ++i) data.push_back(std::byte{0x3f});
  files.push_back(
      testing::safetensors_bytes(R"({"ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},)"
                                 R"("flag":{"dtype":"U8","shape":[],"data_offsets":[24,25]},)"
                                 R"("e":{"dtype":"F32","shape":[0],"data_offsets":[25,25]},)"
                                 R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[25,29]}})",
                                 data));
  files.push_back(testing::safetensors_bytes(
      R"({"__metadata__":{"a":"b"},"x":{"dtype":"F32","shape":[1,1,2],"data_offsets":[0,8]}} )",
      testing::bytes_of(std::vector<float>{1.0f, 2.0f})));
  return files;
}

/// One seeded mutation of `file`.
class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : engine_(seed) {}

  void mutate(Bytes& file) {
    switch (pick(7)) {
      case 0:
        flip_bit(file);
        break;
      case 1:
        replace_byte(file);
        break;
      case 2:
        file.resize(pick(file.size() + 1));
        break;  // truncate
      case 3:   // append
        for (std::size_t n = 1 + pick(9); n > 0; --n) file.push_back(std::byte(pick(256)));
        break;
      case 4:
        edit_length(file);
        break;
      default:
        edit_json(file);
        break;
    }
  }

 private:
  std::size_t pick(std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(engine_);
  }

  /// The header's text, or empty if the file is too damaged to hold one.
  static std::string header_of(const Bytes& file) {
    if (file.size() < 8) return {};
    std::uint64_t length = 0;
    std::memcpy(&length, file.data(), 8);
    if (length > file.size() - 8) return {};
    return {reinterpret_cast<const char*>(file.data()) + 8, length};
  }

  /// A position, three times in four inside the header (where parsing decisions are made).
  std::size_t position(const Bytes& file) {
    const std::size_t header_end = std::min(file.size(), 8 + header_of(file).size());
    return pick(4) != 0 && header_end > 0 ? pick(header_end) : pick(file.size());
  }

  void flip_bit(Bytes& file) {
    if (file.empty()) return;
    file[position(file)] ^= std::byte(1u << pick(8));
  }

  void replace_byte(Bytes& file) {
    static constexpr std::string_view interesting = "{}[]\",:-019e. \0\xff";
    if (file.empty()) return;
    const std::size_t at = position(file);
    file[at] = pick(2) ? std::byte(interesting[pick(interesting.size())]) : std::byte(pick(256));
  }

  void edit_length(Bytes& file) {
    if (file.size() < 8) return;
    std::uint64_t length = 0;
    std::memcpy(&length, file.data(), 8);
    const std::uint64_t size = file.size();
    const std::array<std::uint64_t, 10> choices{
        0,        length - 1, length + 1, size - 8,    size,
        size - 7, 1ull << 63, ~0ull,      100'000'000, length + 8 * pick(4)};
    length = choices[pick(choices.size())];
    std::memcpy(file.data(), &length, 8);
  }

  /// Replaces one token of the header's JSON (a number, a dtype, a punctuation mark, a key) and
  /// writes the header back, usually with its new length.
  void edit_json(Bytes& file) {
    std::string header = header_of(file);
    if (header.empty()) return flip_bit(file);
    static const std::array<std::string, 14> numbers{
        "-1",    "0",   "1",  "9223372036854775807", "9223372036854775808", "18446744073709551616",
        "1e400", "2.5", "-0", "4611686018427387904", "2305843009213693952", "null",
        "\"3\"", "[1]"};
    static const std::array<std::string, 8> dtypes{"\"F32\"", "\"F64\"", "\"F16\"", "\"BF16\"",
                                                   "\"I64\"", "\"U8\"",  "\"F99\"", "\"\""};
    const std::size_t at = pick(header.size());
    switch (pick(6)) {
      case 0: {  // a number
        const std::size_t begin = header.find_first_of("0123456789", at);
        if (begin == std::string::npos) break;
        const std::size_t end = header.find_first_not_of("0123456789", begin);
        header.replace(begin, end - begin, numbers[pick(numbers.size())]);
        break;
      }
      case 1: {  // a dtype
        const std::size_t begin = header.find("\"dtype\":", at);
        if (begin == std::string::npos) break;
        const std::size_t value = begin + 8, end = header.find('"', value + 1) + 1;
        header.replace(value, end - value, dtypes[pick(dtypes.size())]);
        break;
      }
      case 2:  // drop a character
        header.erase(at, 1);
        break;
      case 3: {  // repeat a key with its value: a duplicate
        const std::size_t begin = header.find("\"data_offsets\":", at);
        if (begin == std::string::npos) break;
        const std::size_t end = header.find(']', begin) + 1;
        header.insert(begin, header.substr(begin, end - begin) + ",");
        break;
      }
      case 4: {  // the same entry again under another name: two tensors on one byte range
        const std::size_t begin = header.find("{\"dtype\"", at);
        if (begin == std::string::npos) break;
        const std::size_t end = header.find('}', begin) + 1;
        header.insert(1, "\"copy\":" + header.substr(begin, end - begin) + ",");
        break;
      }
      default:  // nest it deeper, or wrap it
        header.insert(at, pick(2) ? "[" : "{\"k\":");
        break;
    }
    const std::uint64_t old_length = file.size() >= 8 ? header_of(file).size() : 0;
    const std::uint64_t length = pick(10) != 0 ? header.size() : old_length;
    Bytes rebuilt = testing::safetensors_bytes(header, {}, length);
    rebuilt.insert(rebuilt.end(), file.begin() + 8 + static_cast<std::ptrdiff_t>(old_length),
                   file.end());
    file = std::move(rebuilt);
  }

  std::mt19937_64 engine_;
};

/// The stored bytes of `info` in `file`, found independently of the library's own bytes().
std::span<const std::byte> stored_bytes(const Bytes& file, const TensorInfo& info) {
  std::uint64_t length = 0;
  std::memcpy(&length, file.data(), 8);
  return std::span(file).subspan(8 + length + static_cast<std::size_t>(info.begin),
                                 static_cast<std::size_t>(info.end - info.begin));
}

/// What `info`'s stored values are as floats (F32 exactly, the others as load converts them).
std::vector<float> expected_floats(std::span<const std::byte> bytes, const std::string& dtype) {
  std::vector<float> values;
  const auto each = [&](std::size_t size, auto convert) {
    for (std::size_t i = 0; i + size <= bytes.size(); i += size) values.push_back(convert(i));
  };
  const auto bits = [&]<class T>(T, std::size_t i) {
    T value;
    std::memcpy(&value, bytes.data() + i, sizeof(T));
    return value;
  };
  if (dtype == "F32")
    each(4, [&](std::size_t i) { return std::bit_cast<float>(bits(std::uint32_t{}, i)); });
  if (dtype == "F64")
    each(8, [&](std::size_t i) {
      return static_cast<float>(std::bit_cast<double>(bits(std::uint64_t{}, i)));
    });
  if (dtype == "F16")
    each(2, [&](std::size_t i) { return fp16_to_float(bits(std::uint16_t{}, i)); });
  if (dtype == "BF16")
    each(2, [&](std::size_t i) { return bf16_to_float(bits(std::uint16_t{}, i)); });
  return values;
}

bool readable(const std::string& dtype) {
  return dtype == "F32" || dtype == "F64" || dtype == "F16" || dtype == "BF16";
}

/// Loads (float and double), load_into and view at rank `Rank`; for the tensor's own rank and a
/// dtype dissect reads, each must succeed with exactly the expected values.
template <std::size_t Rank>
void exercise(const SafetensorsFile& file, const Bytes& bytes, const TensorInfo& info) {
  const bool fits = info.shape.size() == Rank && readable(info.dtype);
  try {
    const auto loaded = file.load<float, Rank>(info.name);
    ASSERT_TRUE(fits) << info.name << ": load accepted a tensor it should refuse";
    const auto expected = expected_floats(stored_bytes(bytes, info), info.dtype);
    ASSERT_EQ(static_cast<std::size_t>(loaded.size()), expected.size()) << info.name;
    ASSERT_TRUE(expected.empty() ||
                std::memcmp(loaded.data(), expected.data(), expected.size() * 4) == 0)
        << info.name;

    Tensor<double, Rank> target(loaded.shape());
    load_into(file, info.name, target.view());
    for (index_t i = 0; i < target.size(); ++i) {
      const double widened = static_cast<double>(loaded.data()[i]);
      if (info.dtype != "F64") {
        ASSERT_TRUE(target.data()[i] == widened || std::isnan(widened));
      }
    }
  } catch (const Error&) {
    ASSERT_FALSE(fits) << info.name << ": a tensor that fits was refused";
  }
  // A view is the file's own bytes — those the header points to — where they are F32 and
  // aligned for float.
  const std::byte* own = file.bytes(info.name).data();
  const bool viewable = info.shape.size() == Rank && info.dtype == "F32" &&
                        reinterpret_cast<std::uintptr_t>(own) % alignof(float) == 0;
  try {
    const auto view = file.view<Rank>(info.name);
    ASSERT_TRUE(viewable) << info.name << ": view accepted a tensor it should refuse";
    ASSERT_EQ(static_cast<const void*>(view.data()), static_cast<const void*>(own));
    const auto stored = stored_bytes(bytes, info);
    ASSERT_TRUE(stored.empty() || std::memcmp(view.data(), stored.data(), stored.size()) == 0);
  } catch (const Error&) {
    ASSERT_FALSE(viewable) << info.name << ": a viewable tensor was refused";
  }
}

TEST(SafetensorsFuzz, MutatedFilesLoadExactlyOrThrowTheLibrarysError) {
  constexpr int iterations = 50'000;
  const std::vector<Bytes> seeds = seed_files();
  Mutator mutator(20240525);
  std::mt19937 chooser(7);
  int opened = 0, refused = 0;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    Bytes bytes = seeds[chooser() % seeds.size()];
    for (unsigned n = 1 + chooser() % 3; n > 0; --n) mutator.mutate(bytes);
    try {
      const SafetensorsFile file = SafetensorsFile::from_bytes(bytes, "fuzz.safetensors");
      ++opened;
      // What the library promises about an opened file, checked from the outside: every range
      // inside the data section, exactly the bytes its shape needs, the section covered once.
      std::uint64_t header_length = 0;
      std::memcpy(&header_length, bytes.data(), 8);
      const index_t data_size = static_cast<index_t>(bytes.size() - 8 - header_length);
      index_t covered = 0;
      for (const TensorInfo& info : file.tensors()) {
        ASSERT_EQ(info.begin, covered) << "iteration " << iteration;
        ASSERT_LE(info.end, data_size) << "iteration " << iteration;
        covered = info.end;
        SCOPED_TRACE(testing::concat_for_trace("iteration", iteration, "tensor", info.name));
        exercise<1>(file, bytes, info);
        exercise<2>(file, bytes, info);
        exercise<3>(file, bytes, info);
        exercise<4>(file, bytes, info);
      }
      ASSERT_EQ(covered, data_size) << "iteration " << iteration;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& error) {
      FAIL() << "iteration " << iteration << " threw a non-dissect exception: " << error.what();
    }
    if (HasFatalFailure()) return;
  }
  std::cout << "[ fuzz     ] " << iterations << " mutated files: " << opened << " opened, "
            << refused << " refused\n";
  EXPECT_GT(opened, iterations / 50) << "the mutations should leave some files intact";
  EXPECT_GT(refused, iterations / 2);
}

}  // namespace test_safetensors_fuzz
}  // namespace dissect
