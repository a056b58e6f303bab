// dissect/kernels/detail/vector_math_avx512.hpp — private: e^x, σ and the activations on 16
// floats, for the epilogue of the AVX-512 GEMM (gemm_avx512.hpp): avx512::exp, sigmoid, relu,
// silu, gelu_tanh, gelu and activate.
//
// The functions are written once, in vector_math_body.hpp, over the AVX-512 lane operations of
// simd_avx512.hpp; vector_math_avx2.hpp compiles the same body on 8 floats, and the results are
// identical bit for bit. The formulas, their bounds and special values are stated there.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_avx512.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/activation.hpp"
#include "dissect/kernels/detail/simd_avx512.hpp"
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"

#if DISSECT_X86

// GCC 12's own AVX-512 intrinsics (_mm512_undefined_* passthroughs) trip its (maybe-)uninitialized
// warnings wherever they are inlined (GCC PR 105593): silenced for these functions only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define DISSECT_SIMD_NAMESPACE avx512
#define DISSECT_SIMD_TARGET DISSECT_TARGET_AVX512
#include "dissect/kernels/detail/vector_math_body.hpp"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // DISSECT_X86
