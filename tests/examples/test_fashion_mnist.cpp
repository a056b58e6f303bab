// Tests for the examples' Fashion-MNIST reader: small IDX files, good and corrupt, written to a
// temporary directory. Each bad file must give a DatasetError that names the file and says what
// is wrong — never a crash, an out-of-bounds read, a huge allocation or a silently wrong load.
#include "common/fashion_mnist.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using dissect::examples::DatasetError;
using dissect::examples::DatasetMissing;
using dissect::examples::load_fashion_mnist;
using dissect::examples::read_image_set;

constexpr std::uint32_t kImagesMagic = 0x0803, kLabelsMagic = 0x0801;
constexpr std::uint32_t kSide = 28;

/// An IDX file: big-endian magic and dimensions, then `payload`.
std::string idx(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                const std::string& payload) {
  std::string out;
  auto put = [&](std::uint32_t word) {
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((word >> shift) & 0xFF);
  };
  put(magic);
  for (std::uint32_t dim : dims) put(dim);
  return out + payload;
}

/// n images of 28 × 28 whose pixels all equal the image's index, and labels i mod 10.
std::string pixels(std::uint32_t n, std::uint32_t side = kSide) {
  std::string out;
  for (std::uint32_t i = 0; i < n; ++i) out.append(side * side, static_cast<char>(i));
  return out;
}
std::string labels(std::uint32_t n) {
  std::string out;
  for (std::uint32_t i = 0; i < n; ++i) out += static_cast<char>(i % 10);
  return out;
}

class FashionMnistFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dissect-fashion-mnist-" + std::to_string(::getpid()) + "-" + test->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Writes `bytes` to dir/name, or gzipped to dir/name.gz.
  void write(const std::string& name, const std::string& bytes, bool gzip = false) {
    if (!gzip) {
      std::ofstream(dir_ / name, std::ios::binary) << bytes;
      return;
    }
    gzFile file = gzopen((dir_ / (name + ".gz")).c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
  }

  /// A consistent split of n images, in the given form.
  void write_split(const std::string& split, std::uint32_t n, bool gzip = false) {
    write(split + "-images-idx3-ubyte", idx(kImagesMagic, {n, kSide, kSide}, pixels(n)), gzip);
    write(split + "-labels-idx1-ubyte", idx(kLabelsMagic, {n}, labels(n)), gzip);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// Loading must throw DatasetError whose message contains every one of `parts`.
  void expect_error(const std::vector<std::string>& parts) {
    try {
      load_fashion_mnist(dir_, -1, -1);
      ADD_FAILURE() << "loading should have thrown";
    } catch (const DatasetError& error) {
      for (const auto& part : parts) {
        EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
            << "message: " << error.what() << "\nexpected: " << part;
      }
    }
  }

  fs::path dir_;
};

TEST_F(FashionMnistFiles, ReadsPlainAndGzippedFiles) {
  for (bool gzip : {false, true}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_split("train", 12, gzip);
    write_split("t10k", 3, gzip);
    const auto data = load_fashion_mnist(dir_, -1, -1);
    ASSERT_EQ(data.train.count, 12);
    ASSERT_EQ(data.test.count, 3);
    EXPECT_EQ(data.train.pixels_per_image(), 784);
    EXPECT_EQ(data.train.pixels.size(), 12u * 784u);
    EXPECT_EQ(data.train.image(11)[783], 11);
    EXPECT_EQ(data.train.labels[11], 1);
    EXPECT_EQ(data.test.labels[2], 2);
  }
}

TEST_F(FashionMnistFiles, LimitReadsOnlyTheFirstImages) {
  write_split("train", 12, true);
  write_split("t10k", 3);
  const auto data = load_fashion_mnist(dir_, 5, 100);
  EXPECT_EQ(data.train.count, 5);
  EXPECT_EQ(data.train.pixels.size(), 5u * 784u);
  EXPECT_EQ(data.train.image(4)[0], 4);
  EXPECT_EQ(data.test.count, 3);  // a limit above the split's size takes it all
}

TEST_F(FashionMnistFiles, MissingFileIsDatasetMissing) {
  write_split("train", 2);
  EXPECT_THROW(load_fashion_mnist(dir_, -1, -1), DatasetMissing);
}

TEST_F(FashionMnistFiles, EmptySplitIsAnError) {
  write_split("train", 0);
  write_split("t10k", 3);
  expect_error({path("train-images-idx3-ubyte"), "holds no images"});
  write_split("train", 4);
  write_split("t10k", 0, true);
  expect_error({path("t10k-images-idx3-ubyte.gz"), "holds no images"});
}

TEST_F(FashionMnistFiles, TestImagesOfAnotherSizeAreAnError) {
  write_split("train", 4);
  write("t10k-images-idx3-ubyte", idx(kImagesMagic, {3, 32, 32}, pixels(3, 32)));
  write("t10k-labels-idx1-ubyte", idx(kLabelsMagic, {3}, labels(3)));
  expect_error({path("t10k-images-idx3-ubyte"), "32x32", "28x28"});
}

TEST_F(FashionMnistFiles, LabelCountMustMatchImageCount) {
  write_split("train", 4);
  write("t10k-images-idx3-ubyte", idx(kImagesMagic, {3, kSide, kSide}, pixels(3)));
  write("t10k-labels-idx1-ubyte", idx(kLabelsMagic, {5}, labels(5)));
  expect_error({path("t10k-labels-idx1-ubyte"), "5 labels, but " + path("t10k-images-idx3-ubyte"),
                " holds 3 images"});
}

TEST_F(FashionMnistFiles, WrongMagicIsAnError) {
  write_split("t10k", 3);
  // A labels file where the images should be, as a mix-up of names would give.
  write("train-images-idx3-ubyte", idx(kLabelsMagic, {4}, labels(4)));
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {4}, labels(4)));
  expect_error({path("train-images-idx3-ubyte"), "IDX magic 0x00000801, expected 0x00000803"});
  write("train-images-idx3-ubyte", idx(kImagesMagic, {4, kSide, kSide}, pixels(4)));
  write("train-labels-idx1-ubyte", idx(0x0802, {4}, labels(4)));
  expect_error({path("train-labels-idx1-ubyte"), "IDX magic 0x00000802"});
}

TEST_F(FashionMnistFiles, HeaderWhoseExtentsOverflowIsAnError) {
  write_split("t10k", 3);
  write("train-images-idx3-ubyte", idx(kImagesMagic, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, ""));
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {4}, labels(4)));
  expect_error({path("train-images-idx3-ubyte"), "overflows int64"});
}

TEST_F(FashionMnistFiles, HeaderThatExceedsThePlainFileIsAnError) {
  write_split("t10k", 3);
  // 4 billion images declared, 2 present: refused before anything is allocated.
  write("train-images-idx3-ubyte", idx(kImagesMagic, {0xFFFFFFFF, kSide, kSide}, pixels(2)));
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {0xFFFFFFFF}, labels(2)));
  expect_error({path("train-images-idx3-ubyte"), "3367254359280 bytes of data", "holds only 1568",
                "truncated"});
}

TEST_F(FashionMnistFiles, TruncatedGzippedFileIsAnError) {
  write_split("t10k", 3);
  // The same lie inside gzip, where the size is not known up front: the read stops at the end
  // of what is there, and the buffer never grows past it.
  write("train-images-idx3-ubyte", idx(kImagesMagic, {0xFFFFFFFF, kSide, kSide}, pixels(2)), true);
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {0xFFFFFFFF}, labels(2)), true);
  expect_error({path("train-images-idx3-ubyte.gz"), "ends after 1568 of the 3367254359280 bytes"});
}

TEST_F(FashionMnistFiles, CutGzipStreamIsAnError) {
  write_split("train", 40, true);
  write_split("t10k", 3);
  const auto gz = dir_ / "train-images-idx3-ubyte.gz";
  fs::resize_file(gz, fs::file_size(gz) / 2);
  expect_error({path("train-images-idx3-ubyte.gz")});
}

TEST_F(FashionMnistFiles, TruncatedHeaderIsAnError) {
  write_split("t10k", 3);
  write("train-images-idx3-ubyte", idx(kImagesMagic, {4}, ""));  // rows and cols missing
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {4}, labels(4)));
  expect_error({path("train-images-idx3-ubyte"), "ends inside the IDX header"});
}

TEST_F(FashionMnistFiles, DataAfterTheDeclaredEndIsAnError) {
  write_split("t10k", 3);
  write("train-images-idx3-ubyte", idx(kImagesMagic, {4, kSide, kSide}, pixels(5)), true);
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {4}, labels(4)));
  expect_error({path("train-images-idx3-ubyte.gz"), "more data than the 3136 bytes"});
}

TEST_F(FashionMnistFiles, LabelOutsideTheTenClassesIsAnError) {
  write_split("t10k", 3);
  write("train-images-idx3-ubyte", idx(kImagesMagic, {4, kSide, kSide}, pixels(4)));
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {4}, std::string("\x01\x02\x0A\x03", 4)));
  expect_error({path("train-labels-idx1-ubyte"), "label 10 of image 2"});
}

TEST_F(FashionMnistFiles, SingleSplitReaderChecksToo) {
  write("train-images-idx3-ubyte", idx(kImagesMagic, {0, kSide, kSide}, ""));
  write("train-labels-idx1-ubyte", idx(kLabelsMagic, {0}, ""));
  EXPECT_THROW(read_image_set(dir_, "train"), DatasetError);
}

}  // namespace
