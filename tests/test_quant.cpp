// Tests of dissect/quant/weight_format.hpp and quantize.hpp and of quantised Linear layers: the
// stored values bit-identical to torch's (bf16, per-channel int8) and to GGUF's Q4_0 rule worked
// by hand; each format's reconstruction bound; a quantised layer's forward against the float
// layer within Σ|x|·(that bound) and against Ŵ in float within the reduction bound; dx-only
// backward; QLoRA; whole models; and every refusal.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dissect/lora.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/quant/kernel_path.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/transforms/quantize.hpp"
#include "support/fixture_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_quant {

using testing::gamma;

constexpr double u32 = 1.0 / (1 << 24);  // float's unit roundoff

Tensor<float, 2> random_matrix(index_t rows, index_t cols, float scale, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Tensor<float, 2> w({rows, cols});
  for (auto& v : w) v = normal(engine);
  return w;
}

/// The documented per-weight reconstruction bound of `q` at [r, c] (weight_format.hpp).
double reconstruction_bound(const QuantizedWeight& q, float w, index_t r, index_t c) {
  switch (q.format()) {
    case WeightFormat::bf16:
      return std::ldexp(1.0, -8) * std::abs(w);  // half a step of an 8-bit significand
    case WeightFormat::int8: {
      // q = round(w·(1/s)): the product and the inverse each round (≤ 127·2u in units of s),
      // and s·q rounds once more (u·|ŵ|).
      const double s = q.int8_scales()[static_cast<std::size_t>(r)];
      return s / 2 + s * 127 * 3 * u32 + u32 * 128 * s;
    }
    case WeightFormat::q4_0: {
      const std::size_t block = static_cast<std::size_t>(r * (q.cols() / 32) + c / 32);
      const double d16 = fp16_to_float(q.q4_scales()[block]);
      // |d| from the clamp (one step), 8·|d − fp16(d)| from the stored scale; d is recovered
      // from d16 to within fp16's half-ulp (2⁻¹¹ relative, or 2⁻²⁵ absolute when subnormal).
      const double d = std::abs(d16) * (1 + std::ldexp(1.0, -11)) + std::ldexp(1.0, -25);
      const double scale_error = std::abs(d16) * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
      return d + 8 * scale_error + 16 * u32 * d;
    }
    default:  // ggml's formats: their bytes are proven equal to ggml's (test_ggml_dot)
      ADD_FAILURE() << "no reconstruction bound for " << weight_format_name(q.format());
      return 0;
  }
}

// ---- the stored values -------------------------------------------------------------------------

TEST(QuantFixtures, Bf16AndInt8AreTorchsBitForBit) {
  const int cases = testing::for_each_fixture<float>("quant", [](const testing::Fixture& f) {
    const auto w = testing::tensor_from<float, 2>(f.tensor("W"));
    const auto bf16 = QuantizedWeight::quantize(w.cview(), WeightFormat::bf16);
    const auto torch_bf16 = testing::tensor_from<float, 2>(f.tensor("bf16"));
    EXPECT_TENSOR_EQ(bf16.dequantize(), torch_bf16);

    const auto int8 = QuantizedWeight::quantize(w.cview(), WeightFormat::int8);
    const auto values = testing::tensor_from<float, 2>(f.tensor("int8_values"));
    const auto scales = testing::tensor_from<float, 1>(f.tensor("int8_scales"));
    ASSERT_EQ(int8.int8_values().size(), static_cast<std::size_t>(values.size()));
    for (index_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(static_cast<float>(int8.int8_values()[static_cast<std::size_t>(i)]),
                values.data()[i])
          << "value " << i;
    }
    for (index_t r = 0; r < scales.size(); ++r) {
      EXPECT_EQ(int8.int8_scales()[static_cast<std::size_t>(r)], scales.data()[r]) << "row " << r;
    }
  });
  EXPECT_EQ(cases, 5);
}

TEST(QuantFormat, Int8ZeroRowGetsScaleOneAndZeros) {
  Tensor<float, 2> w({2, 5});
  w(1, 3) = -2.54f;  // row 0 all zero
  const auto q = QuantizedWeight::quantize(w.cview(), WeightFormat::int8);
  EXPECT_EQ(q.int8_scales()[0], 1.0f);
  for (int c = 0; c < 5; ++c) EXPECT_EQ(q.int8_values()[static_cast<std::size_t>(c)], 0);
  EXPECT_EQ(q.int8_scales()[1], 2.54f / 127.0f);
  EXPECT_EQ(q.int8_values()[8], -127);
  EXPECT_EQ(q.dequantize()(0, 2), 0.0f);
}

TEST(QuantFormat, Q4_0FollowsGgufRuleWorkedByHand) {
  // Block 0: w_j = j − 12: the extreme is 19 (j = 31), d = 19/−8 = −2.375 (exact in fp16).
  // Block 1: 8 comes before −8, so m = 8, d = −1 and −8 maps to 16 before the clamp: one step.
  Tensor<float, 2> w({1, 64});
  for (int j = 0; j < 32; ++j) w(0, j) = static_cast<float>(j - 12);
  const std::vector<float> second{8, -8, 0, 0.5f, -0.5f, 1.5f};
  for (std::size_t j = 0; j < second.size(); ++j) w(0, 32 + static_cast<index_t>(j)) = second[j];
  const auto q = QuantizedWeight::quantize(w.cview(), WeightFormat::q4_0);
  ASSERT_EQ(q.q4_scales().size(), 2u);
  EXPECT_EQ(fp16_to_float(q.q4_scales()[0]), -2.375f);
  EXPECT_EQ(fp16_to_float(q.q4_scales()[1]), -1.0f);
  const auto nibble = [&](int j) {
    const std::uint8_t byte = q.q4_nibbles()[static_cast<std::size_t>((j / 32) * 16 + j % 16)];
    return j % 32 < 16 ? byte & 0x0f : byte >> 4;
  };
  // trunc((j − 12)·(−8/19) + 8.5), clamped to 15, worked out by hand:
  EXPECT_EQ(nibble(0), 13);   // −12 → 5.05 + 8.5 = 13.55
  EXPECT_EQ(nibble(12), 8);   //   0 → 8.5
  EXPECT_EQ(nibble(13), 8);   //   1 → 8.08
  EXPECT_EQ(nibble(14), 7);   //   2 → 7.66
  EXPECT_EQ(nibble(24), 3);   //  12 → 3.45
  EXPECT_EQ(nibble(31), 0);   //  19 → 0.5
  EXPECT_EQ(nibble(32), 0);   //   8 → −8 + 8.5
  EXPECT_EQ(nibble(33), 15);  //  −8 → 16.5 → 16, clamped
  EXPECT_EQ(nibble(34), 8);   //   0
  EXPECT_EQ(nibble(35), 8);   // 0.5 → 8.0: half rounds up, toward +∞ in q
  EXPECT_EQ(nibble(36), 9);   // −0.5 → 9.0
  EXPECT_EQ(nibble(37), 7);   // 1.5 → 7.0
  const auto back = q.dequantize();
  EXPECT_EQ(back(0, 0), 5 * -2.375f);
  EXPECT_EQ(back(0, 32), 8.0f);
  EXPECT_EQ(back(0, 33), -7.0f);  // the clamp's one step
  EXPECT_EQ(back(0, 37), 1.0f);
}

TEST(QuantFormat, ReconstructionWithinEachFormatsBound) {
  int checked = 0;
  for (const float scale : {1e-6f, 1e-2f, 1.0f, 3e2f}) {
    for (const auto format : {WeightFormat::bf16, WeightFormat::int8, WeightFormat::q4_0}) {
      const auto w = random_matrix(9, 96, scale, 11 + static_cast<std::uint64_t>(format));
      const auto q = QuantizedWeight::quantize(w.cview(), format);
      const auto back = q.dequantize();
      double worst = 0;
      for (index_t r = 0; r < 9; ++r) {
        for (index_t c = 0; c < 96; ++c) {
          const double error = std::abs(double(back(r, c)) - double(w(r, c)));
          const double bound = reconstruction_bound(q, w(r, c), r, c);
          ASSERT_LE(error, bound) << weight_format_name(format) << " scale " << scale << " [" << r
                                  << ", " << c << "]";
          worst = std::max(worst, error / bound);
          ++checked;
        }
      }
      // The bound is reached, not vacuous: the worst weight uses over a third of it.
      EXPECT_GT(worst, 0.3) << weight_format_name(format) << " scale " << scale;
    }
  }
  EXPECT_EQ(checked, 4 * 3 * 9 * 96);
}

TEST(QuantFormat, BytesAndNames) {
  const auto w = random_matrix(4, 64, 1.0f, 3);
  EXPECT_EQ(QuantizedWeight::quantize(w.cview(), WeightFormat::bf16).bytes(), 4 * 64 * 2);
  EXPECT_EQ(QuantizedWeight::quantize(w.cview(), WeightFormat::int8).bytes(), 4 * 64 + 4 * 4);
  EXPECT_EQ(QuantizedWeight::quantize(w.cview(), WeightFormat::q4_0).bytes(), 4 * 2 * 18);
  EXPECT_EQ(weight_format_from_name("q4"), WeightFormat::q4_0);
  EXPECT_EQ(weight_format_from_name("int8"), WeightFormat::int8);
  EXPECT_EQ(weight_format_name(WeightFormat::q4_0), "q4_0");
  EXPECT_THROW_WITH(weight_format_from_name("int4"), ConfigError, "\"int4\" is not one of");
  EXPECT_THROW_WITH(weight_format_name(static_cast<WeightFormat>(8)), ConfigError,
                    "WeightFormat(8)");
}

TEST(QuantFormat, SizesAndNamesAreTheDtypeTables) {
  // One vocabulary (dtype.hpp): a format's name and its weights' bytes are its dtype's; int8
  // adds one fp32 scale per row.
  const auto w = random_matrix(3, 96, 1.0f, 5);
  for (WeightFormat format :
       {WeightFormat::bf16, WeightFormat::int8, WeightFormat::q4_0, WeightFormat::q8_0}) {
    const Dtype dtype = dtype_of(format);
    EXPECT_EQ(weight_format_name(format), dtype_name(dtype));
    const index_t scales = format == WeightFormat::int8 ? 3 * index_t{sizeof(float)} : 0;
    EXPECT_EQ(QuantizedWeight::quantize(w.cview(), format).bytes(),
              bytes_for(3 * 96, dtype) + scales)
        << weight_format_name(format);
  }
  EXPECT_EQ(dtype_of(WeightFormat::q4_0), Dtype::q4_0);
  EXPECT_EQ(dtype_of(WeightFormat::q4_K), Dtype::q4_K);
  EXPECT_THROW_WITH(dtype_of(static_cast<WeightFormat>(8)), ConfigError, "WeightFormat(8)");
}

TEST(QuantFormat, RefusesWhatItCannotStore) {
  Tensor<float, 2> empty({0, 32});
  EXPECT_THROW_WITH(QuantizedWeight::quantize(empty.cview(), WeightFormat::int8), ShapeError,
                    "[0, 32] is empty");
  auto w = random_matrix(3, 40, 1.0f, 5);
  EXPECT_THROW_WITH(QuantizedWeight::quantize(w.cview(), WeightFormat::q4_0), ShapeError,
                    "in_features 40 of weight [3, 40] is not a multiple of the block size 32");
  w(2, 7) = std::nanf("");
  for (const auto format : {WeightFormat::bf16, WeightFormat::int8}) {
    EXPECT_THROW_WITH(QuantizedWeight::quantize(w.cview(), format), Error, "weight[2, 7] is nan");
  }
  w(2, 7) = 3.4e38f;
  EXPECT_THROW_WITH(QuantizedWeight::quantize(w.cview(), WeightFormat::bf16), Error,
                    "rounds to infinity in bf16");
  auto big = random_matrix(1, 32, 1.0f, 6);
  big(0, 5) = -6e5f;
  EXPECT_THROW_WITH(QuantizedWeight::quantize(big.cview(), WeightFormat::q4_0), Error,
                    "row 0, block 0 (columns 0..31)");
  big(0, 5) = std::numeric_limits<float>::infinity();
  EXPECT_THROW_WITH(QuantizedWeight::quantize(big.cview(), WeightFormat::q4_0), Error,
                    "weight[0, 5] is inf");
}

TEST(QuantFormat, FromPartsChecksSizesAndScales) {
  EXPECT_THROW_WITH(QuantizedWeight::from_bf16(2, 3, std::vector<std::uint16_t>(5)), ShapeError,
                    "5 values for a [2, 3] weight");
  EXPECT_THROW_WITH(QuantizedWeight::from_int8(2, 3, std::vector<std::int8_t>(6), {1.0f}),
                    ShapeError, "needs 2 scales");
  EXPECT_THROW_WITH(QuantizedWeight::from_int8(1, 2, {1, -128}, {1.0f}), Error,
                    "value[0, 1] is -128");
  EXPECT_THROW_WITH(QuantizedWeight::from_int8(2, 1, {1, 1}, {1.0f, 0.0f}), Error,
                    "scale of row 1 is 0");
  EXPECT_THROW_WITH(
      QuantizedWeight::from_q4_0(1, 32, std::vector<std::uint8_t>(16), {float_to_fp16(1e9f)}),
      Error, "row 0, block 0 is not finite");
  EXPECT_THROW_WITH(QuantizedWeight::from_q4_0(1, 48, std::vector<std::uint8_t>(24), {0, 0}),
                    ShapeError, "multiple of 32");
  // Parts taken from a quantised weight rebuild it exactly.
  const auto w = random_matrix(3, 64, 1.0f, 8);
  const auto q = QuantizedWeight::quantize(w.cview(), WeightFormat::q4_0);
  const auto again =
      QuantizedWeight::from_q4_0(3, 64, {q.q4_nibbles().begin(), q.q4_nibbles().end()},
                                 {q.q4_scales().begin(), q.q4_scales().end()});
  EXPECT_TENSOR_EQ(again.dequantize(), q.dequantize());
}

// ---- quantised layers --------------------------------------------------------------------------

/// The error a kernel path adds by rounding the activations (quant/detail/quant_kernels.hpp):
/// avx512_vnni quantises each block of 32 to int8 with sx = max|x_block|/127, off by at most
/// (sx/2)(1 + 2⁻¹⁴) each; avx512_bf16 rounds each to bf16, off by at most 2⁻⁸·|x|. Also returns
/// the activations' magnitudes widened by that much, for the reduction term.
double activation_term(quant::KernelPath path, const Tensor<float, 2>& x, index_t i,
                       const Linear<float>& layer, index_t n) {
  double term = 0;
  const index_t K = layer.in_features();
  for (index_t k0 = 0; k0 < K; k0 += 32) {
    double sx = 0;
    for (index_t k = k0; k < std::min(K, k0 + 32); ++k)
      sx = std::max(sx, std::abs(double(x(i, k))));
    sx /= 127;
    for (index_t k = k0; k < std::min(K, k0 + 32); ++k) {
      const double w = std::abs(double(layer.weight()(n, k)));
      if (path == quant::KernelPath::avx512_vnni) term += sx / 2 * (1 + std::ldexp(1.0, -14)) * w;
      if (path == quant::KernelPath::avx512_bf16)
        term += std::ldexp(1.0, -8) * std::abs(x(i, k)) * w;
    }
  }
  return term;
}

struct LayerCase {
  index_t rows, in, out;
  bool bias;
};

/// Forward of a quantised layer (a) against the float layer holding Ŵ — the kernels against
/// Eigen, both fp32 reductions: 2·γ_K·Σ|x|·|ŵ| + |b|·u — and (b) against the original float layer
/// within Σ_k |x_k|·bound_k (the format's reconstruction) plus both reductions.
TEST(QuantizedLinear, ForwardWithinTheFormatsBound) {
  const std::vector<LayerCase> cases{{1, 32, 17, true},  {8, 64, 33, false}, {3, 96, 1, true},
                                     {33, 32, 40, true}, {2, 160, 64, true}, {5, 64, 16, false}};
  for (const auto format : {WeightFormat::bf16, WeightFormat::int8, WeightFormat::q4_0}) {
    for (const auto& c : cases) {
      SCOPED_TRACE(testing::concat_for_trace("format", weight_format_name(format), "rows", c.rows,
                                             "in", c.in, "out", c.out));
      Linear<float> layer(c.in, c.out, {.bias = c.bias, .seed = 21});
      const Linear<float> original = layer;
      layer.quantize(format);
      EXPECT_TRUE(layer.quantized());
      EXPECT_TRUE(layer.frozen());
      const auto& q = layer.quantized_weight();
      EXPECT_TENSOR_EQ(layer.weight(), q.dequantize());
      const Linear<float> float_hat(
          Tensor<float, 2>(layer.weight()),
          c.bias ? std::optional(Tensor<float, 1>(layer.bias())) : std::nullopt);
      const auto x = random_matrix(c.rows, c.in, 1.0f, 31);
      const auto y = layer.forward(x);
      const auto y_hat = float_hat.forward(x);
      const auto y_float = original.forward(x);
      const auto path = quant::active_kernel_path(format, c.rows);
      Tensor<double, 2> kernel_bound({c.rows, c.out}), format_bound({c.rows, c.out});
      for (index_t i = 0; i < c.rows; ++i) {
        for (index_t n = 0; n < c.out; ++n) {
          double magnitude = 0, reconstruction = 0, original_magnitude = 0;
          for (index_t k = 0; k < c.in; ++k) {
            magnitude += std::abs(double(x(i, k)) * layer.weight()(n, k));
            original_magnitude += std::abs(double(x(i, k)) * original.weight()(n, k));
            reconstruction +=
                std::abs(double(x(i, k))) * reconstruction_bound(q, original.weight()(n, k), n, k);
          }
          const double b = c.bias ? std::abs(double(layer.bias()(n))) : 0.0;
          // Rounded activations reach the reduction too: its magnitudes widen by as much.
          const double activation = activation_term(path, x, i, layer, n);
          kernel_bound(i, n) =
              activation + 2 * gamma<float>(c.in + 8) * (magnitude + 2 * activation + b);
          format_bound(i, n) =
              reconstruction + activation +
              gamma<float>(c.in + 8) * (magnitude + 2 * activation + original_magnitude + 2 * b);
        }
      }
      EXPECT_TENSOR_WITHIN(y, y_hat, kernel_bound);
      EXPECT_TENSOR_WITHIN(y, y_float, format_bound);
      // forward_into and a rank-3 input agree with forward.
      Tensor<float, 2> into({c.rows, c.out});
      layer.forward_into(x, into);
      EXPECT_TENSOR_EQ(into, y);
    }
  }
}

TEST(QuantizedLinear, BackwardGivesDxOnlyThroughWHat) {
  Linear<float> layer(64, 24, {.seed = 2});
  layer.quantize(WeightFormat::int8);
  const auto x = random_matrix(5, 64, 1.0f, 1);
  const auto dy = random_matrix(5, 24, 1.0f, 2);
  const auto dx = layer.backward(x, dy);
  Linear<float> float_hat(Tensor<float, 2>(layer.weight()), Tensor<float, 1>(layer.bias()));
  const auto dx_ref = float_hat.backward(x, dy);
  EXPECT_TENSOR_EQ(dx, dx_ref);  // the same Eigen product on the same Ŵ
  EXPECT_THROW_WITH(layer.weight_grad(), Error, "frozen");
  EXPECT_EQ(trainable_parameter_count(layer), 0);
  EXPECT_EQ(layer.parameter_count(), 64 * 24 + 24);
  EXPECT_EQ(layer.weight_bytes(), 64 * 24 + 24 * 4);
}

TEST(QuantizedLinear, RefusalsLeaveTheLayerAsItWas) {
  Linear<float> layer(32, 8, {.seed = 3});
  layer.quantize(WeightFormat::q4_0);
  const auto before = layer.weight_bytes();
  EXPECT_THROW_WITH(layer.quantize(WeightFormat::int8), Error,
                    "Linear::quantize: the weight is stored as q4_0");
  Tensor<float, 2> w({8, 32});
  EXPECT_THROW_WITH(layer.set_weight(w.cview()), Error, "Linear::set_weight: the weight is stored");
  EXPECT_THROW_WITH(layer.set_frozen(false), Error, "dequantize() the layer first");
  EXPECT_THROW_WITH(
      layer.set_quantized_weight(QuantizedWeight::quantize(w.cview(), WeightFormat::bf16)), Error,
      "set_quantized_weight");
  EXPECT_EQ(layer.weight_bytes(), before);
  Linear<float> other(32, 9, {.seed = 3});
  Tensor<float, 2> ones({8, 32});
  for (auto& v : ones) v = 1;
  EXPECT_THROW_WITH(
      other.set_quantized_weight(QuantizedWeight::quantize(ones.cview(), WeightFormat::bf16)),
      ShapeError, "quantised weight [8, 32] does not fit weight [9, 32]");
  EXPECT_FALSE(other.quantized());
  layer.dequantize();
  EXPECT_FALSE(layer.quantized());
  EXPECT_EQ(layer.weight_bytes(), 32 * 8 * 4);
  EXPECT_THROW_WITH(layer.dequantize(), Error, "not quantised");
  EXPECT_THROW_WITH(layer.quantized_weight(), Error, "not quantised");
}

TEST(QuantizedLinear, AReleasedDenseWeightLeavesTheQuantisedForwardAndRefusesWhatNeedsW) {
  Linear<float> kept(64, 24, {.seed = 8});
  kept.quantize(WeightFormat::q4_0);
  Linear<float> freed = kept;
  EXPECT_THROW_WITH(Linear<float>(64, 24).release_dense_weight(), Error,
                    "Linear::release_dense_weight: the layer [24, 64] is not quantised");
  freed.release_dense_weight();
  EXPECT_TRUE(freed.dense_weight_released());
  EXPECT_EQ(freed.in_features(), 64);
  EXPECT_EQ(freed.out_features(), 24);
  EXPECT_EQ(freed.weight_bytes(), kept.weight_bytes());
  const auto x = random_matrix(5, 64, 1.0f, 9);
  EXPECT_TENSOR_EQ(freed.forward(x), kept.forward(x));  // the same quantised product
  // The weight is no parameter any more: only the bias is visited.
  EXPECT_EQ(freed.parameter_count(), 24);
  int visited = 0;
  freed.for_each_parameter([&](const ParameterName& name, auto, auto) {
    EXPECT_EQ(name.str(), "bias");
    ++visited;
  });
  EXPECT_EQ(visited, 1);
  const std::string gone = "the dense weight [24, 64] was released (release_dense_weight)";
  EXPECT_THROW_WITH(freed.weight(), Error, "Linear::weight: " + gone);
  EXPECT_THROW_WITH(std::as_const(freed).weight(), Error, gone);
  EXPECT_THROW_WITH(freed.dequantize(), Error, "Linear::dequantize: " + gone);
  EXPECT_TRUE(freed.quantized());
  EXPECT_THROW_WITH(freed.attach_adapter({.rank = 2}), Error, "Linear::attach_adapter: " + gone);
  EXPECT_THROW_WITH(freed.backward(x, random_matrix(5, 24, 1.0f, 10)), Error,
                    "Linear::backward: " + gone);
  EXPECT_THROW_WITH(freed.set_frozen(false), Error, "dequantize() the layer first");
  EXPECT_THROW_WITH(freed.pack(), Error, "Linear::pack: the weight is stored as q4_0");
  EXPECT_THROW_WITH(freed.forward(random_matrix(5, 63, 1.0f, 11)), ShapeError,
                    "input last dim 63 != in_features 64 (x: [5, 63], weight: [24, 64])");
  // set_quantized_weight(…, DenseCopy::release) is the loader's way to the same layer.
  Linear<float> loaded(64, 24, {.seed = 8});
  loaded.set_quantized_weight(kept.quantized_weight(), DenseCopy::release);
  EXPECT_TRUE(loaded.dense_weight_released());
  EXPECT_TENSOR_EQ(loaded.forward(x), kept.forward(x));
}

TEST(QuantizedLinear, WeightsLeftUnwrittenAtConstructionAreWhatALoaderWrites) {
  // ConstructionOptions::leave_weights_unwritten: W is allocated but not zeroed; a loader writes
  // it (or frees it) next, and the layer then behaves as any other.
  Tensor<float, 2> w({6, 32});
  for (index_t i = 0; i < w.size(); ++i) w.data()[i] = 0.01f * float(i % 17) - 0.05f;
  const ConstructionScope loading({.initialise = false, .leave_weights_unwritten = true});
  Linear<float> layer(32, 6);
  layer.set_weight(w.cview());
  layer.set_bias(Tensor<float, 1>({6}).cview());
  EXPECT_TENSOR_EQ(layer.weight(), w.cview());
  const ConstructionScope zeroed({.initialise = false});
  const Linear<float> zeros(32, 6);
  for (const float v : zeros.weight()) ASSERT_EQ(v, 0.0f);  // the documented default: zeros
}

TEST(QuantizedLinear, QLoRAAdapterOnAQuantisedBase) {
  Linear<float> layer(64, 16, {.seed = 4});
  layer.quantize(WeightFormat::q4_0);
  auto& adapter = layer.attach_adapter({.rank = 4, .alpha = 8, .seed = 5});
  std::mt19937_64 engine(6);
  for (auto& v : adapter.B()) v = std::uniform_real_distribution<float>(-1, 1)(engine);
  // The same adapter on a float layer holding Ŵ: the adapter's term is computed identically.
  Linear<float> float_hat(Tensor<float, 2>(layer.weight()), Tensor<float, 1>(layer.bias()));
  float_hat.attach_adapter(layer.adapter());
  const auto x = random_matrix(3, 64, 1.0f, 7);
  const auto y = layer.forward(x);
  const auto y_ref = float_hat.forward(x);
  // The base product's activation rounding (avx512_vnni for q4_0) plus both reductions.
  const auto path = quant::active_kernel_path(WeightFormat::q4_0, 3);
  Tensor<double, 2> bound({3, 16});
  for (index_t i = 0; i < 3; ++i) {
    for (index_t n = 0; n < 16; ++n) {
      const double activation = activation_term(path, x, i, layer, n);
      bound(i, n) = activation + 2 * gamma<float>(64 + 4 + 8) * (64 * 4 + 2 * activation);
    }
  }
  EXPECT_TENSOR_WITHIN(y, y_ref, bound);
  const auto dy = random_matrix(3, 16, 1.0f, 8);
  layer.backward(x, dy);
  float_hat.backward(x, dy);
  EXPECT_TENSOR_EQ(layer.adapter().B_grad(), float_hat.adapter().B_grad());
  EXPECT_THROW_WITH(layer.merge_adapter(), Error, "merge_adapter: the weight is stored as q4_0");
  std::ostringstream printed;
  printed << layer;
  EXPECT_NE(printed.str().find("weight=q4_0"), std::string::npos) << printed.str();
}

// ---- whole models ------------------------------------------------------------------------------

TEST(QuantizedModel, EveryLinearAndNothingElse) {
  LlamaModel<float> model(testing::quantisable_llama(), {.seed = 9});
  const LlamaModel<float> original = model;
  const auto float_bytes = linear_weight_bytes(model);
  const auto paths = quantize_model(model, WeightFormat::int8);
  // Per layer: qkv, attention proj, gate, up, down; and the untied head.
  EXPECT_EQ(paths.size(), 2u * 5u + 1u);
  EXPECT_EQ(paths.back(), "lm_head");
  int quantised = 0;
  for_each_layer(model, [&](const std::string&, const Linear<float>& layer) {
    quantised += layer.quantized();
  });
  EXPECT_EQ(quantised, 11);
  EXPECT_LT(linear_weight_bytes(model) * 3, float_bytes);
  EXPECT_EQ(trainable_parameter_count(model),
            model.token_embedding().parameter_count() + 2 * 2 * 32 + 32);  // embedding and norms
  const auto ids = testing::random_ids(2 * 6, 37, 1);
  const auto logits = model.forward(TokenBatch{ids, 2, 6});
  const auto reference = original.forward(TokenBatch{ids, 2, 6});
  // int8 moves each weight by at most s/2 ≤ max|w|/254: the logits move by a small fraction of
  // their size, and they do move (the quantised kernels ran).
  double largest = 0, moved = 0;
  for (index_t i = 0; i < reference.size(); ++i) {
    largest = std::max(largest, std::abs(double(reference.data()[i])));
    moved = std::max(moved, std::abs(double(logits.data()[i]) - double(reference.data()[i])));
  }
  EXPECT_LT(moved, 0.05 * largest);
  EXPECT_GT(moved, 0.0);
}

TEST(QuantizedModel, AFailureLeavesTheModelAsItWas) {
  GPT2Model<float> model(testing::small_gpt2(), {.seed = 2});  // D = 16: no q4_0 blocks
  EXPECT_THROW_WITH(quantize_model(model, WeightFormat::q4_0), ShapeError,
                    "quantize_model: layer h.0.attn.qkv: quantize(q4_0): in_features 16");
  int quantised = 0;
  for_each_layer(model, [&](const std::string&, const Linear<float>& layer) {
    quantised += layer.quantized();
  });
  EXPECT_EQ(quantised, 0);
  EXPECT_EQ(quantize_model(model, WeightFormat::bf16).size(), 2u * 4u);  // tied head stays
}

}  // namespace test_quant
}  // namespace dissect
