// dissect/quant/detail/quant_tile_body.hpp — private: what every quantised micro-kernel does
// with its accumulators before and after its K loop, written once for every instruction set,
// included once per set (quant_kernels_avx2.hpp, quant_kernels_avx512.hpp). No #pragma once, on
// purpose.
//
// The includer defines DISSECT_SIMD_NAMESPACE (avx2 or avx512: the lane operations are those of
// dissect::kernels::detail::DISSECT_SIMD_NAMESPACE, kernels/detail/simd_avx2.hpp or
// simd_avx512.hpp) and DISSECT_SIMD_TARGET (their target attribute, which every function here
// must carry for GCC to inline the intrinsics into it), and this file undefines both at its end.
// The functions land in dissect::quant::detail::DISSECT_SIMD_NAMESPACE.

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_tile_body.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif
#if !defined(DISSECT_SIMD_NAMESPACE) || !defined(DISSECT_SIMD_TARGET)
#error "quant_tile_body.hpp: define DISSECT_SIMD_NAMESPACE and DISSECT_SIMD_TARGET first"
#endif

namespace dissect::quant::detail::DISSECT_SIMD_NAMESPACE {

namespace simd = dissect::kernels::detail::DISSECT_SIMD_NAMESPACE;

/// Zeroes MR × NR accumulators; GCC keeps the arrays in registers once the loops unroll.
template <int MR, int NR>
DISSECT_SIMD_TARGET inline void zero(simd::vec (&acc)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[i][r] = simd::setzero();
  }
}

/// put() of each accumulator's lane sum: acc[i][r] is y[i0 + i, n0 + r] over the tile's K range,
/// times row_scales[n0 + r] where the format scales a whole weight row (int8), once at the end.
template <int MR, int NR, class Scales = std::nullptr_t>
DISSECT_SIMD_TARGET DISSECT_ALWAYS_INLINE inline void put_sums(const Output& out,
                                                               const simd::vec (&acc)[MR][NR],
                                                               index_t i0, index_t n0, bool first,
                                                               bool last,
                                                               Scales row_scales = nullptr) {
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < NR; ++r) {
      float sum = simd::sum_lanes(acc[i][r]);
      if constexpr (!std::is_null_pointer_v<Scales>) sum *= row_scales[n0 + r];
      put(out, i0 + i, n0 + r, sum, first, last);
    }
  }
}

/// The same for a tile that may keep a second set of accumulators (Split: small tiles have too
/// few independent FMA chains to cover the latency with one): each pair is added, then summed.
template <bool Split, int MR, int NR>
DISSECT_SIMD_TARGET DISSECT_ALWAYS_INLINE inline void put_sums(const Output& out,
                                                               const simd::vec (&acc)[MR][NR],
                                                               const simd::vec (&second)[MR][NR],
                                                               index_t i0, index_t n0, bool first,
                                                               bool last) {
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < NR; ++r) {
      const simd::vec sum = Split ? simd::add(acc[i][r], second[i][r]) : acc[i][r];
      put(out, i0 + i, n0 + r, simd::sum_lanes(sum), first, last);
    }
  }
}

}  // namespace dissect::quant::detail::DISSECT_SIMD_NAMESPACE

#undef DISSECT_SIMD_TARGET
#undef DISSECT_SIMD_NAMESPACE
