// A consumer of dissect::io: if this builds, links and reads back what it wrote, the installed
// package carries the I/O target and its dependency.
#include <dissect/io/state_dict.hpp>
#include <dissect/layers/linear.hpp>
#include <filesystem>
#include <iostream>

int main() {
  const dissect::Linear<float> saved(8, 4, {.seed = 1});
  dissect::Linear<float> loaded(8, 4, {.seed = 2});
  const auto path = std::filesystem::temp_directory_path() / "dissect-consumer-io.safetensors";
  dissect::save_module(path, saved);
  dissect::load_state_dict(loaded, dissect::SafetensorsFile(path));
  std::filesystem::remove(path);
  const bool same = dissect::allclose(loaded.weight(), saved.weight(), 0.0, 0.0) &&
                    dissect::allclose(loaded.bias(), saved.bias(), 0.0, 0.0);
  std::cout << (same ? "round trip exact" : "round trip differs") << "\n";
  return same ? 0 : 1;
}
