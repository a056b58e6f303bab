// fuzz/fuzz_safetensors.cpp — libFuzzer harness for the safetensors header and its readers.
//
// The input is a whole file, checked in memory (SafetensorsFile::from_bytes runs the very
// parse() that opening a path runs). A file that opens must keep the header's promises: its
// tensors cover the data section exactly, each tensor's bytes lie inside the input, and every
// reader (load, view, load_into, load_block_into) either reads those bytes or throws
// dissect::Error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dissect/io/safetensors.hpp"
#include "fuzz_support.hpp"

namespace dissect::fuzz {
namespace {

/// Every reader, at rank R, on one tensor (each may refuse it: another rank, dtype, alignment).
template <std::size_t R>
void read_at_rank(const SafetensorsFile& file, const TensorInfo& info) {
  expect_only_dissect_errors([&] { (void)file.load<float, R>(info.name); });
  expect_only_dissect_errors([&] { (void)file.load<double, R>(info.name); });
  expect_only_dissect_errors([&] { (void)file.view<R, float>(info.name); });
  expect_only_dissect_errors([&] { (void)file.view<R, double>(info.name); });
  if (info.shape.size() != R) return;
  expect_only_dissect_errors([&] {
    Shape<R> shape{};
    std::copy(info.shape.begin(), info.shape.end(), shape.begin());
    Tensor<float, R> target(shape);
    load_into(file, info.name, target.view());
  });
}

void read_blocks(const SafetensorsFile& file, const TensorInfo& info) {
  if (info.shape.empty() || info.shape.size() > 2) return;
  const index_t rows = info.shape[0], cols = info.shape.size() == 2 ? info.shape[1] : 1;
  // The whole tensor, its last element, and a block one past the end (refused).
  const index_t blocks[][4] = {
      {0, rows, 0, cols},
      {rows > 0 ? rows - 1 : 0, rows > 0, cols > 0 ? cols - 1 : 0, cols > 0},
      {rows, 1, 0, 1}};
  for (const auto& block : blocks) {
    const index_t row0 = block[0], height = block[1], col0 = block[2], width = block[3];
    expect_only_dissect_errors([&] {
      Tensor<float, 2> target({height, width});
      load_block_into(file, info.name, row0, height, col0, width, target.view());
    });
  }
}

}  // namespace
}  // namespace dissect::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  fuzz::expect_only_dissect_errors([&] {
    const SafetensorsFile file =
        SafetensorsFile::from_bytes(fuzz::bytes_of(data, size), "fuzz.safetensors");
    index_t covered = 0;
    for (const TensorInfo& info : file.tensors()) {
      fuzz::require(file.contains(info.name) && &file.info(info.name) == &info, "index");
      const auto span = file.bytes(info.name);
      fuzz::require(span.size() == static_cast<std::size_t>(info.end - info.begin), "byte span");
      covered += info.end - info.begin;
      fuzz::read_at_rank<1>(file, info);
      fuzz::read_at_rank<2>(file, info);
      fuzz::read_at_rank<3>(file, info);
      fuzz::read_at_rank<4>(file, info);
      fuzz::read_blocks(file, info);
    }
    std::uint64_t header = 0;
    std::memcpy(&header, data, 8);
    fuzz::require(covered == static_cast<index_t>(size - 8 - header), "coverage");
    fuzz::require(file.tensor_names().size() == file.tensors().size(), "names");
  });
  return 0;
}
