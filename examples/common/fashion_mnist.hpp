// examples/common/fashion_mnist.hpp — reads Fashion-MNIST from its gzipped IDX files.
//
// NOT part of the dissect library: example-only, and it needs zlib. The Debian package
// `dataset-fashion-mnist` installs the four files under /usr/share/datasets/fashion-mnist/;
// uncompressed copies (the same names without .gz) are read too. IDX is a big-endian header —
// magic (0x0803 for ubyte images of rank 3, 0x0801 for ubyte labels of rank 1), one uint32 per
// dimension — followed by the raw bytes, row-major.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dissect::examples {

/// The default install location of the Debian package.
inline const char* const fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";
inline const char* const fashion_mnist_package = "dataset-fashion-mnist";

/// Fashion-MNIST's ten classes, by label.
inline constexpr std::array<const char*, 10> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/// A data file that is not there: the caller tells the user which package to install.
struct DatasetMissing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One split: `count` images of rows × cols pixels (0 = background … 255), row-major, and one
/// label in [0, 10) per image.
struct ImageSet {
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> pixels;  // [count, rows·cols]
  std::vector<std::int64_t> labels;  // [count]

  std::int64_t pixels_per_image() const { return rows * cols; }
  const std::uint8_t* image(std::int64_t i) const { return pixels.data() + i * rows * cols; }
};

struct FashionMnist {
  ImageSet train;
  ImageSet test;
};

namespace detail {

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

/// `name.gz`, else `name` uncompressed (gzread passes plain files through), else DatasetMissing.
inline std::filesystem::path find_data_file(const std::filesystem::path& dir,
                                            const std::string& name) {
  std::error_code ec;
  for (const auto& candidate : {dir / (name + ".gz"), dir / name}) {
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate;
  }
  throw DatasetMissing("Fashion-MNIST file " + (dir / (name + ".gz")).string() + " not found");
}

class IdxReader {
 public:
  explicit IdxReader(std::filesystem::path path) : path_(std::move(path)) {
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) throw std::runtime_error("cannot open " + path_.string());
    gzbuffer(file_.get(), 1 << 17);
  }

  /// Reads the header and checks its magic; returns the dimensions.
  std::vector<std::int64_t> header(std::uint32_t expected_magic) {
    const std::uint32_t magic = read_u32();
    if (magic != expected_magic) {
      throw std::runtime_error(path_.string() + ": IDX magic " + std::to_string(magic) +
                               ", expected " + std::to_string(expected_magic) +
                               " (is this the right file?)");
    }
    std::vector<std::int64_t> dims(expected_magic & 0xFF);
    for (auto& dim : dims) dim = read_u32();
    return dims;
  }

  /// Exactly `count` bytes into `out`, or an error naming the file (a truncated download).
  void read(std::uint8_t* out, std::int64_t count) {
    while (count > 0) {
      const auto chunk =
          static_cast<unsigned>(std::min<std::int64_t>(count, std::int64_t{1} << 30));
      const int got = gzread(file_.get(), out, chunk);
      if (got <= 0) {
        int code = 0;
        const char* message = gzerror(file_.get(), &code);
        throw std::runtime_error(path_.string() + ": file ends early or is corrupt" +
                                 (code != Z_OK ? std::string(" (") + message + ")" : ""));
      }
      out += got;
      count -= got;
    }
  }

 private:
  std::uint32_t read_u32() {
    std::array<std::uint8_t, 4> bytes{};
    read(bytes.data(), 4);
    return std::uint32_t{bytes[0]} << 24 | std::uint32_t{bytes[1]} << 16 |
           std::uint32_t{bytes[2]} << 8 | std::uint32_t{bytes[3]};
  }

  std::filesystem::path path_;
  GzFile file_;
};

}  // namespace detail

/// Reads the first min(limit, available) images and labels of one split ("train" or "t10k");
/// limit < 0 reads all. Only the bytes needed are decompressed, so a small limit is fast.
/// @throws DatasetMissing if a file is absent; std::runtime_error if one is malformed.
inline ImageSet read_image_set(const std::filesystem::path& dir, const std::string& split,
                               std::int64_t limit = -1) {
  detail::IdxReader images(detail::find_data_file(dir, split + "-images-idx3-ubyte"));
  detail::IdxReader labels(detail::find_data_file(dir, split + "-labels-idx1-ubyte"));
  const auto image_dims = images.header(0x0803);
  const auto label_dims = labels.header(0x0801);
  if (image_dims[0] != label_dims[0]) {
    throw std::runtime_error("Fashion-MNIST " + split + ": " + std::to_string(image_dims[0]) +
                             " images but " + std::to_string(label_dims[0]) + " labels");
  }
  ImageSet set;
  set.count = limit < 0 ? image_dims[0] : std::min(limit, image_dims[0]);
  set.rows = image_dims[1];
  set.cols = image_dims[2];
  set.pixels.resize(static_cast<std::size_t>(set.count * set.rows * set.cols));
  images.read(set.pixels.data(), static_cast<std::int64_t>(set.pixels.size()));
  std::vector<std::uint8_t> raw_labels(static_cast<std::size_t>(set.count));
  labels.read(raw_labels.data(), set.count);
  set.labels.assign(raw_labels.begin(), raw_labels.end());
  for (std::size_t i = 0; i < raw_labels.size(); ++i) {
    if (raw_labels[i] >= fashion_mnist_classes.size()) {
      throw std::runtime_error("Fashion-MNIST " + split + ": label " +
                               std::to_string(raw_labels[i]) + " of image " + std::to_string(i) +
                               " is not a class in [0, 10)");
    }
  }
  return set;
}

/// Both splits; a limit < 0 takes the whole split.
inline FashionMnist load_fashion_mnist(const std::filesystem::path& dir, std::int64_t train_limit,
                                       std::int64_t test_limit) {
  return {read_image_set(dir, "train", train_limit), read_image_set(dir, "t10k", test_limit)};
}

}  // namespace dissect::examples
