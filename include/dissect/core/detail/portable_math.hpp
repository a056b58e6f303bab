// dissect/core/detail/portable_math.hpp — private: do not include directly (dissect/tensor/init.hpp
// does).
//
// A natural logarithm built only from IEEE operations that are correctly rounded everywhere
// (frexp, +, −, ×, ÷, fma), so the normal samples in init.hpp are the same bits on every
// platform. std::log is not: the C++ standard leaves its accuracy to the implementation.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/core/detail/portable_math.hpp is private to dissect: include any public dissect header (they share it) instead"
#endif

#include <cmath>

namespace dissect::detail {

/// ln(x) for finite x > 0, within a few ulp of the true value and bitwise reproducible.
inline double portable_log(double x) {
  int exponent = 0;
  double mantissa = std::frexp(x, &exponent);  // x = mantissa · 2^exponent, mantissa ∈ [0.5, 1)
  // Centre the mantissa on 1 (∈ [√½, √2)) so the series below converges fast.
  if (mantissa < 0.70710678118654752440) {
    mantissa *= 2.0;
    exponent -= 1;
  }
  // ln(m) = 2·atanh(s) with s = (m − 1)/(m + 1), |s| ≤ 0.1716: the odd series
  // 2·(s + s³/3 + s⁵/5 + …) reaches double precision after 12 terms.
  const double s = (mantissa - 1.0) / (mantissa + 1.0);
  const double s2 = s * s;
  double series = 1.0 / 25.0;
  for (int k = 11; k >= 0; --k) series = std::fma(series, s2, 1.0 / (2 * k + 1));
  const double log_mantissa = 2.0 * s * series;
  // ln 2 split in two so exponent·ln2_hi is exact for any double exponent.
  constexpr double ln2_hi = 6.93147180369123816490e-01;
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  const double e = static_cast<double>(exponent);
  return std::fma(e, ln2_hi, std::fma(e, ln2_lo, log_mantissa));
}

}  // namespace dissect::detail
