// examples/common/fashion_mnist.hpp — reads Fashion-MNIST from its gzipped IDX files.
//
// NOT part of the dissect library: example-only, and it needs zlib. The Debian package
// `dataset-fashion-mnist` installs the four files under /usr/share/datasets/fashion-mnist/;
// uncompressed copies (the same names without .gz) are read too. IDX is a big-endian header —
// magic (0x0803 for ubyte images of rank 3, 0x0801 for ubyte labels of rank 1), one uint32 per
// dimension — followed by the raw bytes, row-major.
//
// Nothing in a file is trusted: every header is checked against the file before it decides an
// allocation, and every error is a DatasetError naming the file and what is wrong with it.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/shape.hpp"

namespace dissect::examples {

/// The default install location of the Debian package.
inline const char* const fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";
inline const char* const fashion_mnist_package = "dataset-fashion-mnist";

/// Every Fashion-MNIST image is 28 × 28 pixels; a file that says otherwise is another data set.
inline constexpr std::int64_t fashion_mnist_rows = 28;
inline constexpr std::int64_t fashion_mnist_cols = 28;

/// Fashion-MNIST's ten classes, by label.
inline constexpr std::array<const char*, 10> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/// A data file that is corrupt, truncated or inconsistent with its partner: the message starts
/// with the file's path.
struct DatasetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A data file that is not there: the caller tells the user which package to install.
struct DatasetMissing : DatasetError {
  using DatasetError::DatasetError;
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
    if (!file_) fail("cannot open");
    gzbuffer(file_.get(), 1 << 17);
  }

  const std::filesystem::path& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw DatasetError(path_.string() + ": " + what);
  }

  /// Reads the header and checks its magic; returns the dimensions. For an uncompressed file
  /// the declared payload is checked against the file's size here, before anything is
  /// allocated; a gzipped one is checked as it is read (see read).
  std::vector<std::int64_t> header(std::uint32_t expected_magic) {
    const std::uint32_t magic = read_u32("magic number");
    if (magic != expected_magic) {
      fail("IDX magic " + hex(magic) + ", expected " + hex(expected_magic) +
           " (is this the right file?)");
    }
    std::vector<std::int64_t> dims(expected_magic & 0xFF);
    std::string shape;
    for (auto& dim : dims) {
      dim = read_u32("dimensions");
      shape += (shape.empty() ? "" : ", ") + std::to_string(dim);
    }
    declared_ = 1;
    try {
      for (auto dim : dims) declared_ = checked_mul(declared_, dim, "IDX payload size");
    } catch (const OverflowError&) {
      fail("header declares dimensions [" + shape + "], whose product overflows int64");
    }
    std::error_code ec;
    const auto file_bytes = std::filesystem::file_size(path_, ec);
    const auto header_bytes = static_cast<std::int64_t>(4 * (dims.size() + 1));
    if (!ec && gzdirect(file_.get()) &&
        declared_ > static_cast<std::int64_t>(file_bytes) - header_bytes) {
      fail("header declares [" + shape + "] = " + std::to_string(declared_) +
           " bytes of data, but the file holds only " +
           std::to_string(static_cast<std::int64_t>(file_bytes) - header_bytes) + " (truncated?)");
    }
    return dims;
  }

  /// The next `count` bytes of data, or an error naming the file. The buffer grows as bytes
  /// arrive instead of being sized from the header up front, so a gzipped file whose header
  /// promises more than it holds costs at most 64 MiB beyond what it does hold.
  std::vector<std::uint8_t> read(std::int64_t count) {
    std::vector<std::uint8_t> out;
    out.reserve(static_cast<std::size_t>(std::min<std::int64_t>(count, std::int64_t{1} << 26)));
    while (static_cast<std::int64_t>(out.size()) < count) {
      const std::size_t have = out.size();
      const auto want = static_cast<unsigned>(
          std::min<std::int64_t>(count - static_cast<std::int64_t>(have), std::int64_t{1} << 24));
      out.resize(have + want);
      const int got = read_some(out.data() + have, want);
      if (got == 0) {
        fail("ends after " + std::to_string(have) + " of the " + std::to_string(declared_) +
             " bytes of data its header declares (truncated?)");
      }
      out.resize(have + static_cast<std::size_t>(got));
    }
    return out;
  }

  /// Checks that nothing follows the declared data. For a gzipped file this read also makes
  /// zlib verify the stream's CRC.
  void expect_end() {
    std::uint8_t extra = 0;
    if (read_some(&extra, 1) > 0) {
      fail("has more data than the " + std::to_string(declared_) +
           " bytes its header declares (wrong header?)");
    }
  }

 private:
  std::uint32_t read_u32(const char* field) {
    std::array<std::uint8_t, 4> bytes{};
    if (read_some(bytes.data(), 4) != 4)
      fail(std::string("ends inside the IDX header (") + field + ")");
    return std::uint32_t{bytes[0]} << 24 | std::uint32_t{bytes[1]} << 16 |
           std::uint32_t{bytes[2]} << 8 | std::uint32_t{bytes[3]};
  }

  /// gzread: up to `count` bytes, fewer only at the end of the data; a corrupt stream is an
  /// error with zlib's own words.
  int read_some(void* out, unsigned count) {
    const int got = gzread(file_.get(), out, count);
    int code = 0;
    if (got < 0) fail(std::string("corrupt compressed data (") + gzerror(file_.get(), &code) + ")");
    return got;
  }

  static std::string hex(std::uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08X", static_cast<unsigned>(value));
    return text;
  }

  std::filesystem::path path_;
  GzFile file_;
  std::int64_t declared_ = 0;  // bytes of data the header declares
};

}  // namespace detail

/// Reads the first min(limit, available) images and labels of one split ("train" or "t10k");
/// limit < 0 reads all. Only the bytes needed are decompressed, so a small limit is fast; a
/// full read also checks that each file ends where its header says.
/// @throws DatasetMissing if a file is absent; DatasetError if one is malformed, holds no
///         images, images that are not 28 × 28, a label outside [0, 10), or a label count that
///         differs from the image count.
inline ImageSet read_image_set(const std::filesystem::path& dir, const std::string& split,
                               std::int64_t limit = -1) {
  detail::IdxReader images(detail::find_data_file(dir, split + "-images-idx3-ubyte"));
  detail::IdxReader labels(detail::find_data_file(dir, split + "-labels-idx1-ubyte"));
  const auto image_dims = images.header(0x0803);
  const auto label_dims = labels.header(0x0801);
  const std::int64_t available = image_dims[0];
  if (available == 0) images.fail("holds no images");
  if (image_dims[1] != fashion_mnist_rows || image_dims[2] != fashion_mnist_cols) {
    images.fail("images are " + std::to_string(image_dims[1]) + "x" +
                std::to_string(image_dims[2]) + " pixels; Fashion-MNIST's are 28x28");
  }
  if (label_dims[0] != available) {
    labels.fail(std::to_string(label_dims[0]) + " labels, but " + images.path().string() +
                " holds " + std::to_string(available) + " images");
  }

  ImageSet set;
  set.count = limit < 0 ? available : std::min(limit, available);
  set.rows = image_dims[1];
  set.cols = image_dims[2];
  set.pixels = images.read(checked_product({set.count, set.rows, set.cols}, "image bytes"));
  const auto raw_labels = labels.read(set.count);
  if (set.count == available) {
    images.expect_end();
    labels.expect_end();
  }
  set.labels.assign(raw_labels.begin(), raw_labels.end());
  for (std::size_t i = 0; i < raw_labels.size(); ++i) {
    if (raw_labels[i] >= fashion_mnist_classes.size()) {
      labels.fail("label " + std::to_string(raw_labels[i]) + " of image " + std::to_string(i) +
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
