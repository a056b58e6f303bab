// dissect/kernels/detail/vector_math_avx2.hpp — private: e^x, σ and the activations on 8 floats,
// for the epilogue of the AVX2 GEMM (gemm_avx2.hpp): avx2::exp, sigmoid, relu, silu, gelu_tanh,
// gelu and activate.
//
// The functions are written once, in vector_math_body.hpp, over the AVX2 lane operations of
// simd_avx2.hpp; vector_math_avx512.hpp compiles the same body on 16 floats, and the results are
// identical bit for bit. The formulas, their bounds and special values are stated there.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_avx2.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/activation.hpp"
#include "dissect/kernels/detail/simd_avx2.hpp"
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"

#if DISSECT_X86

#define DISSECT_SIMD_NAMESPACE avx2
#define DISSECT_SIMD_TARGET DISSECT_TARGET_AVX2
#include "dissect/kernels/detail/vector_math_body.hpp"

#endif  // DISSECT_X86
