// dissect/quant/detail/ggml_kquant_codecs.hpp — PRIVATE: include dissect/quant/ggml_blocks.hpp.
//
// The K-quants' encoders and decoders (q2_K … q8_K, 256-value super-blocks), reproducing ggml's
// reference functions under the rules of ggml_block_codecs.hpp, which includes this file after
// the helpers it shares with the legacy formats (the little-endian fields, nearest_int,
// DISSECT_EXACT_FLOAT): kept apart only so that neither file outgrows one reading.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_kquant_codecs.hpp is private to dissect: include dissect/quant/ggml_blocks.hpp instead"
#endif

namespace dissect::detail::ggml {
// ---- K-quants: 256-value super-blocks ---------------------------------------------------------

/// The affine fit of q4_K and q5_K's sub-blocks (ggml's make_qkx2_quants): levels L in
/// [0, nmax] and x ≈ scale·L − min, minimising Σ w·(error)², trying nstep + 1 stretched ranges
/// (nmax + rmin + rdelta·is) after the plain one. Returns scale; `the_min` gets the offset.
DISSECT_EXACT_FLOAT inline float fit_affine_levels(int n, int nmax, const float* x,
                                                   const float* weights, std::uint8_t* L,
                                                   float* the_min, std::uint8_t* candidate,
                                                   float rmin, float rdelta, int nstep) {
  DISSECT_EXACT_FLOAT_BODY
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, l)));
    const float diff = scale * static_cast<float>(L[i]) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      candidate[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      const float lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * static_cast<float>(candidate[i]) + this_min - x[i];
        error += weights[i] * (diff * diff);
      }
      if (error < best_error) {
        std::copy(candidate, candidate + n, L);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

/// The symmetric fit of q6_K's sub-blocks (ggml's make_qx_quants with weights x²): levels
/// L + nmax in [0, 2·nmax) and x ≈ scale·L, trying 18 scales around −nmax / max.
DISSECT_EXACT_FLOAT inline float fit_symmetric_levels(int n, int nmax, const float* x,
                                                      std::int8_t* L) {
  DISSECT_EXACT_FLOAT_BODY
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < group_max_eps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const auto clamp_level = [nmax](int l) { return std::max(-nmax, std::min(nmax - 1, l)); };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_level(nearest_int(iscale * x[i]));
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float lf = static_cast<float>(l);
    sumlx += w * x[i] * lf;
    suml2 += w * lf * lf;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float lf = static_cast<float>(clamp_level(nearest_int(iscale * x[i])));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * lf;
      suml2 += w * lf * lf;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<std::int8_t>(nmax + clamp_level(nearest_int(iscale * x[i])));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

/// Sub-block j's 6-bit scale and min from q4_K / q5_K's 12 packed bytes.
inline void unpack_scale_min(int j, const std::uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// The shared front half of q4_K and q5_K: fit each 32-value sub-block, quantise the fits'
/// scales and mins to 6 bits against the super-block's largest, store d, dmin and the 12 scale
/// bytes at `header`, and requantise every value against the stored scales into `L`.
DISSECT_EXACT_FLOAT inline void quantize_affine_super_block(const float* x, int nmax, float rmin,
                                                            int nstep, std::uint8_t* header,
                                                            std::uint8_t* L) {
  DISSECT_EXACT_FLOAT_BODY
  constexpr int sub_blocks = super_block / 32;
  float scales[sub_blocks], mins[sub_blocks], weights[32];
  std::uint8_t candidate[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < sub_blocks; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_affine_levels(32, nmax, xs, weights, L + 32 * j, &mins[j], candidate, rmin,
                                  0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::uint8_t* packed = header + 4;
  for (int j = 0; j < sub_blocks; ++j) {
    // ggml stores nearest_int's result in a uint8_t before clamping it to 63.
    const int ls = std::min(
        63, static_cast<int>(static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j]))));
    const int lm =
        std::min(63, static_cast<int>(static_cast<std::uint8_t>(nearest_int(inv_min * mins[j]))));
    if (j < 4) {
      packed[j] = static_cast<std::uint8_t>(ls);
      packed[j + 4] = static_cast<std::uint8_t>(lm);
    } else {
      packed[j + 4] = static_cast<std::uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
      packed[j - 4] = static_cast<std::uint8_t>(packed[j - 4] | ((ls >> 4) << 6));
      packed[j] = static_cast<std::uint8_t>(packed[j] | ((lm >> 4) << 6));
    }
  }
  store_f16(header, max_scale / 63.f);
  store_f16(header + 2, max_min / 63.f);
  const float d_all = load_f16(header), dmin_all = load_f16(header + 2);
  for (int j = 0; j < sub_blocks; ++j) {
    int sc, m;
    unpack_scale_min(j, packed, sc, m);
    const float d = d_all * static_cast<float>(sc);
    if (d == 0) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

inline void quantize_q4_K(const float* x, std::uint8_t* block) {
  std::uint8_t L[super_block];
  quantize_affine_super_block(x, 15, -1.f, 20, block, L);
  std::uint8_t* q = block + 16;
  for (int j = 0; j < super_block; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

DISSECT_EXACT_FLOAT inline void dequantize_q4_K(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block), min = load_f16(block + 2);
  const std::uint8_t* packed = block + 4;
  const std::uint8_t* q = block + 16;
  for (int j = 0, is = 0; j < super_block; j += 64, is += 2, q += 32) {
    int sc, m;
    unpack_scale_min(is, packed, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
    unpack_scale_min(is + 1, packed, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

inline void quantize_q5_K(const float* x, std::uint8_t* block) {
  std::uint8_t L[super_block];
  quantize_affine_super_block(x, 31, -0.5f, 15, block, L);
  std::uint8_t* qh = block + 16;
  std::uint8_t* ql = block + 48;
  std::fill(qh, qh + 32, std::uint8_t{0});
  std::uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < super_block; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] = static_cast<std::uint8_t>(qh[j] | m1);
      }
      int l2 = L[n + j + 32];
      if (l2 > 15) {
        l2 -= 16;
        qh[j] = static_cast<std::uint8_t>(qh[j] | m2);
      }
      ql[j] = static_cast<std::uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<std::uint8_t>(m1 << 2);
    m2 = static_cast<std::uint8_t>(m2 << 2);
    ql += 32;
  }
}

DISSECT_EXACT_FLOAT inline void dequantize_q5_K(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block), min = load_f16(block + 2);
  const std::uint8_t* packed = block + 4;
  const std::uint8_t* qh = block + 16;
  const std::uint8_t* ql = block + 48;
  unsigned u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < super_block; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
    int sc, m;
    unpack_scale_min(is, packed, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
    unpack_scale_min(is + 1, packed, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

DISSECT_EXACT_FLOAT inline void quantize_q6_K(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  constexpr int sub_blocks = super_block / 16;
  std::uint8_t* ql = block;
  std::uint8_t* qh = block + 128;
  auto* stored_scales = reinterpret_cast<std::int8_t*>(block + 192);
  std::uint8_t* d_field = block + 208;
  std::int8_t L[super_block];
  float scales[sub_blocks];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < sub_blocks; ++ib) {
    scales[ib] = fit_symmetric_levels(16, 32, x + 16 * ib, L + 16 * ib);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < group_max_eps) {
    std::fill(block, block + 210, std::uint8_t{0});
    return;
  }
  const float iscale = -128.f / max_scale;
  store_f16(d_field, 1 / iscale);
  for (int ib = 0; ib < sub_blocks; ++ib) {
    stored_scales[ib] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  }
  const float d_all = load_f16(d_field);
  for (int j = 0; j < sub_blocks; ++j) {
    const float d = d_all * static_cast<float>(stored_scales[j]);
    if (d == 0) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<std::int8_t>(std::max(-32, std::min(31, l)) + 32);
    }
  }
  for (int j = 0; j < super_block; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0x0f, q2 = L[j + l + 32] & 0x0f;
      const int q3 = L[j + l + 64] & 0x0f, q4 = L[j + l + 96] & 0x0f;
      ql[l] = static_cast<std::uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<std::uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<std::uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                        ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

DISSECT_EXACT_FLOAT inline void dequantize_q6_K(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block + 208);
  const std::uint8_t* ql = block;
  const std::uint8_t* qh = block + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(block + 192);
  for (int n = 0; n < super_block; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

DISSECT_EXACT_FLOAT inline void quantize_q8_K(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  float max = 0, amax = 0;
  for (int j = 0; j < super_block; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  std::uint8_t* qs = block + 4;
  std::uint8_t* bsums = block + 4 + super_block;
  if (amax == 0) {
    std::fill(block, block + 292, std::uint8_t{0});
    return;
  }
  const float iscale = -127.f / max;
  for (int j = 0; j < super_block; ++j) {
    const int v = std::min(127, nearest_int(iscale * x[j]));
    qs[j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(v));
  }
  for (int j = 0; j < super_block / 16; ++j) {
    int sum = 0;
    for (int ii = 0; ii < 16; ++ii) sum += static_cast<std::int8_t>(qs[16 * j + ii]);
    store_u16(bsums + 2 * j, static_cast<std::uint16_t>(static_cast<std::int16_t>(sum)));
  }
  store_u32(block, std::bit_cast<std::uint32_t>(1 / iscale));
}

DISSECT_EXACT_FLOAT inline void dequantize_q8_K(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = std::bit_cast<float>(load_u32(block));
  for (int j = 0; j < super_block; ++j) {
    y[j] = d * static_cast<float>(static_cast<std::int8_t>(block[4 + j]));
  }
}

}  // namespace dissect::detail::ggml
