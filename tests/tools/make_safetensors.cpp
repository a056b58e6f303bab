// tests/tools/make_safetensors.cpp — writes a small safetensors file for the `dissect` command's
// ctest cases, so that no binary test input is committed: a single layer, an adapter, bare
// tensors, a file with no tensors, layer indices near INT64_MAX, …
//
//   make_safetensors OUT [NAME=DIMS]... [--meta KEY=VALUE]...
//
// DIMS is "4x12" (a [4, 12] tensor), "7" ([7]) or empty (a scalar); every value is 0.0f, stored
// as F32. Exit status 0, or 1 with a message.
#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/io/safetensors.hpp"

namespace {

std::vector<dissect::index_t> dims_of(std::string_view text) {
  std::vector<dissect::index_t> dims;
  while (!text.empty()) {
    const std::size_t x = text.find('x');
    dims.push_back(std::stoll(std::string(text.substr(0, x))));
    text = x == std::string_view::npos ? std::string_view() : text.substr(x + 1);
  }
  return dims;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: make_safetensors OUT [NAME=DIMS]... [--meta KEY=VALUE]...\n";
    return 1;
  }
  try {
    struct Spec {
      std::string name;
      std::vector<dissect::index_t> shape;
      std::vector<float> values;
    };
    std::vector<Spec> specs;
    std::map<std::string, std::string> metadata;
    for (int i = 2; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--meta" && i + 1 < argc) {
        const std::string_view pair = argv[++i];
        const std::size_t eq = pair.find('=');
        metadata[std::string(pair.substr(0, eq))] =
            eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1));
        continue;
      }
      const std::size_t eq = arg.rfind('=');
      if (eq == std::string_view::npos) throw std::runtime_error("no '=' in " + std::string(arg));
      Spec spec{std::string(arg.substr(0, eq)), dims_of(arg.substr(eq + 1)), {}};
      dissect::index_t count = 1;
      for (dissect::index_t d : spec.shape) count *= d;
      spec.values.assign(static_cast<std::size_t>(count), 0.0f);
      specs.push_back(std::move(spec));
    }
    std::vector<dissect::SaveEntry> entries;
    for (const Spec& spec : specs) {
      entries.emplace_back(spec.name, spec.shape, std::span<const float>(spec.values));
    }
    dissect::save_safetensors(argv[1], entries, metadata);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "make_safetensors: " << error.what() << "\n";
    return 1;
  }
}
