// Self-test of tests/support/fixture.hpp against the committed PyTorch fixtures: the reader and
// the files must agree (recomputing Linear from the parsed inputs reproduces the parsed outputs),
// and a malformed file must fail with its line number rather than yield wrong numbers.
#include "support/fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fx = dissect::testing;

namespace test_fixture_reader {

// Linear recomputed in double from a fixture's (float32 or float64) inputs. Each output also
// gets the sum of |terms| of its dot product: rounding error is proportional to that, not to the
// output itself, which can cancel to near zero.
struct Reference {
  std::vector<double> value;
  std::vector<double> magnitude;
};

struct LinearDims {
  std::int64_t rows;  // product of the leading dimensions
  std::int64_t in;
  std::int64_t out;
};

LinearDims linear_dims(const fx::Fixture& f) {
  const std::int64_t in = f.meta_int("in_features");
  const std::int64_t out = f.meta_int("out_features");
  return {in == 0 ? 0 : f.tensor("x").numel() / in, in, out};
}

Reference forward(const fx::Fixture& f, const LinearDims& d) {
  const auto& x = f.tensor("x").values;
  const auto& w = f.tensor("W").values;
  Reference r{std::vector<double>(d.rows * d.out), std::vector<double>(d.rows * d.out)};
  for (std::int64_t i = 0; i < d.rows; ++i) {
    for (std::int64_t o = 0; o < d.out; ++o) {
      double sum = f.has("b") ? f.tensor("b").values[o] : 0.0;
      double mag = std::abs(sum);
      for (std::int64_t k = 0; k < d.in; ++k) {
        sum += x[i * d.in + k] * w[o * d.in + k];
        mag += std::abs(x[i * d.in + k] * w[o * d.in + k]);
      }
      r.value[i * d.out + o] = sum;
      r.magnitude[i * d.out + o] = mag;
    }
  }
  return r;
}

Reference grad_x(const fx::Fixture& f, const LinearDims& d) {  // dx = dy · W
  const auto& dy = f.tensor("dy").values;
  const auto& w = f.tensor("W").values;
  Reference r{std::vector<double>(d.rows * d.in), std::vector<double>(d.rows * d.in)};
  for (std::int64_t i = 0; i < d.rows; ++i) {
    for (std::int64_t k = 0; k < d.in; ++k) {
      for (std::int64_t o = 0; o < d.out; ++o) {
        r.value[i * d.in + k] += dy[i * d.out + o] * w[o * d.in + k];
        r.magnitude[i * d.in + k] += std::abs(dy[i * d.out + o] * w[o * d.in + k]);
      }
    }
  }
  return r;
}

Reference grad_w(const fx::Fixture& f, const LinearDims& d) {  // dW = dyᵀ · x
  const auto& dy = f.tensor("dy").values;
  const auto& x = f.tensor("x").values;
  Reference r{std::vector<double>(d.out * d.in), std::vector<double>(d.out * d.in)};
  for (std::int64_t i = 0; i < d.rows; ++i) {
    for (std::int64_t o = 0; o < d.out; ++o) {
      for (std::int64_t k = 0; k < d.in; ++k) {
        r.value[o * d.in + k] += dy[i * d.out + o] * x[i * d.in + k];
        r.magnitude[o * d.in + k] += std::abs(dy[i * d.out + o] * x[i * d.in + k]);
      }
    }
  }
  return r;
}

Reference grad_b(const fx::Fixture& f, const LinearDims& d) {  // db = Σ_rows dy
  const auto& dy = f.tensor("dy").values;
  Reference r{std::vector<double>(d.out), std::vector<double>(d.out)};
  for (std::int64_t i = 0; i < d.rows; ++i) {
    for (std::int64_t o = 0; o < d.out; ++o) {
      r.value[o] += dy[i * d.out + o];
      r.magnitude[o] += std::abs(dy[i * d.out + o]);
    }
  }
  return r;
}

// Largest |parsed - reference| / magnitude; a zero magnitude (empty reduction) demands an exact 0.
double worst_error(const fx::FixtureTensor& parsed, const Reference& ref) {
  EXPECT_EQ(parsed.values.size(), ref.value.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(parsed.values.size(), ref.value.size()); ++i) {
    const double diff = std::abs(parsed.values[i] - ref.value[i]);
    worst = std::max(worst, ref.magnitude[i] == 0.0 ? diff : diff / ref.magnitude[i]);
  }
  return worst;
}

std::vector<std::int64_t> with_last(std::vector<std::int64_t> lead, std::int64_t last) {
  lead.push_back(last);
  return lead;
}

// A malformed fixture in the temp directory, removed again when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    std::random_device random;
    path_ =
        std::filesystem::temp_directory_path() /
        ("dissect_fixture_" + std::to_string(random()) + "_" + std::to_string(random()) + ".txt");
    std::ofstream(path_) << text;
  }
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string error_of(const std::filesystem::path& path) {
  try {
    fx::read_fixture(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "read_fixture(" << path << ") did not throw";
  return "";
}

TEST(FixtureReader, ReadsSmallLinearCase) {
  const fx::Fixture f =
      fx::read_fixture(fx::fixture_dir("linear") / "f32_lead2x5_in4_out3_bias.txt");
  EXPECT_EQ(f.case_name, "f32_lead2x5_in4_out3_bias");
  EXPECT_EQ(f.dtype, "float32");
  EXPECT_EQ(f.meta_int("in_features"), 4);
  EXPECT_EQ(f.meta_int("out_features"), 3);
  EXPECT_TRUE(f.meta_bool("bias"));
  EXPECT_EQ(f.tensors.size(), 8u);
  EXPECT_EQ(f.tensor("x").shape, (std::vector<std::int64_t>{2, 5, 4}));
  EXPECT_EQ(f.tensor("W").shape, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(f.tensor("b").shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(f.tensor("y").shape, (std::vector<std::int64_t>{2, 5, 3}));
  EXPECT_EQ(f.tensor("dW").shape, (std::vector<std::int64_t>{3, 4}));
  // The first value of x as printed: converting back to float must give exactly that float.
  EXPECT_EQ(static_cast<float>(f.tensor("x").values.front()), -1.2154187f);

  const Reference y = forward(f, linear_dims(f));
  const auto& parsed = f.tensor("y").values;
  ASSERT_EQ(parsed.size(), y.value.size());
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    EXPECT_NEAR(parsed[i], y.value[i], 1e-5 * std::max(1.0, std::abs(y.value[i])))
        << "y[" << i << "]";
  }
}

TEST(FixtureReader, EveryLinearFixtureIsSelfConsistent) {
  const auto paths = fx::list_fixtures(fx::fixture_dir("linear"));
  EXPECT_GE(paths.size(), 30u);
  double worst32 = 0.0;
  double worst64 = 0.0;
  for (const auto& path : paths) {
    SCOPED_TRACE(path.string());
    const fx::Fixture f = fx::read_fixture(path);
    EXPECT_EQ(f.case_name + ".txt", path.filename().string());
    ASSERT_TRUE(f.dtype == "float32" || f.dtype == "float64") << f.dtype;
    EXPECT_EQ(f.case_name.substr(0, 3), f.dtype == "float32" ? "f32" : "f64");

    const LinearDims d = linear_dims(f);
    const bool bias = f.meta_bool("bias");
    EXPECT_EQ(f.has("b"), bias);
    EXPECT_EQ(f.has("db"), bias);
    EXPECT_EQ(f.tensors.size(), bias ? 8u : 6u);

    const auto& x_shape = f.tensor("x").shape;
    ASSERT_GE(x_shape.size(), 1u);
    ASSERT_EQ(x_shape.back(), d.in);
    const std::vector<std::int64_t> lead(x_shape.begin(), x_shape.end() - 1);
    EXPECT_EQ(f.tensor("W").shape, (std::vector<std::int64_t>{d.out, d.in}));
    EXPECT_EQ(f.tensor("y").shape, with_last(lead, d.out));
    EXPECT_EQ(f.tensor("dy").shape, with_last(lead, d.out));
    EXPECT_EQ(f.tensor("dx").shape, x_shape);
    EXPECT_EQ(f.tensor("dW").shape, f.tensor("W").shape);
    if (bias) {
      EXPECT_EQ(f.tensor("b").shape, (std::vector<std::int64_t>{d.out}));
      EXPECT_EQ(f.tensor("db").shape, (std::vector<std::int64_t>{d.out}));
    }
    for (const auto& [name, t] : f.tensors) {
      std::int64_t count = 1;
      for (const std::int64_t dim : t.shape) count *= dim;
      EXPECT_EQ(t.numel(), count) << name;
      if (f.dtype == "float32") {
        // The reader snaps float32 fixtures to exact floats (see FixtureTensor).
        for (const double v : t.values)
          ASSERT_EQ(static_cast<double>(static_cast<float>(v)), v) << name;
      }
    }

    double worst = worst_error(f.tensor("y"), forward(f, d));
    worst = std::max(worst, worst_error(f.tensor("dx"), grad_x(f, d)));
    worst = std::max(worst, worst_error(f.tensor("dW"), grad_w(f, d)));
    if (bias) worst = std::max(worst, worst_error(f.tensor("db"), grad_b(f, d)));
    // PyTorch computed in the fixture's dtype, this test in double from the same inputs: the gap
    // is rounding, about 3 unit roundoffs of Σ|terms| with torch 1.13 + OpenBLAS (1.8e-7 float32,
    // 2.8e-16 float64). The bounds leave room for regenerating against another BLAS; a reader or
    // generator bug (a transposed or shifted tensor) is off by order 1.
    const double tolerance = f.dtype == "float32" ? 5e-6 : 1e-14;
    EXPECT_LE(worst, tolerance);
    double& worst_of_dtype = f.dtype == "float32" ? worst32 : worst64;
    worst_of_dtype = std::max(worst_of_dtype, worst);
  }
  std::printf("worst error / sum|terms|: float32 %.3g, float64 %.3g\n", worst32, worst64);
}

TEST(FixtureReader, MissingTensorAndMetaNameFileAndName) {
  const auto path = fx::fixture_dir("linear") / "f64_lead7_in4_out3_nobias.txt";
  const fx::Fixture f = fx::read_fixture(path);
  EXPECT_FALSE(f.has("b"));
  try {
    f.tensor("b");
    FAIL() << "tensor(\"b\") did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.meta_int("no_such_key"), std::runtime_error);
}

TEST(FixtureReader, MalformedFilesReportTheLine) {
  const std::string head = "# comment\ncase broken\ndtype float64\nmeta in_features 2\n";
  struct Bad {
    std::string text;
    std::string expected;  // substring of the message
  };
  const std::vector<Bad> cases = {
      {head + "tensor x 1 2\n1.5 oops\nend\n", ":6: expected value 1 of tensor 'x'"},
      {head + "tensor x 1 2\n1.5\nend\n",
       ":7: expected value 1 of tensor 'x' (2 expected) as a number, got 'end'"},
      {head + "tensor x 1 2\n1.5 2.5 3.5\nend\n",
       ":6: expected a keyword at the start of a line, got '3.5'"},
      {head + "tensor x 2 2\n1.5 2.5\nend\n", ":5: expected dimension 1 of tensor 'x'"},
      {head + "tensor x 1 2 3\n1.5 2.5\nend\n", ":5: expected end of line after 'tensor'"},
      {head + "tensor x 1 -2\nend\n", ":5: expected dimension 0 of tensor 'x' as a non-negative"},
      {head + "tensor x 1 2\n1.5 2.5\n", ":6: expected 'meta', 'tensor' or 'end', got end of file"},
      {head + "tensor x 1 4\n1.5 2.5\n", ":6: expected 4 values for tensor 'x', got only 2 words"},
      {head + "weights x 1 2\nend\n", ":5: expected 'meta', 'tensor' or 'end', got 'weights'"},
      {head + "tensor x 1 1\n1\ntensor x 1 1\n2\nend\n", ":7: expected each tensor name once"},
      {head + "meta in_features 3\nend\n", ":5: expected each meta key once"},
      {head + "end\ntensor x 1 1\n1\n", ":6: expected nothing after 'end'"},
      {"case broken\nmeta a 1\nend\n", ":2: expected 'dtype' at the start of a line, got 'meta'"},
      {"case\ndtype float64\nend\n", ":1: expected a value after 'case', got end of line"},
      {head + "tensor x 2 99999999999 99999999999\nend\n",
       ":5: expected an element count that fits in int64"},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.text);
    const TempFile file(bad.text);
    const std::string message = error_of(file.path());
    EXPECT_NE(message.find(file.path().string() + bad.expected), std::string::npos) << message;
  }
}

TEST(FixtureReader, ListFixturesRejectsMissingDirectory) {
  EXPECT_THROW(fx::list_fixtures(fx::fixture_dir("no_such_block")), std::runtime_error);
  EXPECT_THROW(fx::read_fixture(fx::fixture_dir("linear") / "no_such_case.txt"),
               std::runtime_error);
}

}  // namespace test_fixture_reader
