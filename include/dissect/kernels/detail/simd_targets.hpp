// dissect/kernels/detail/simd_targets.hpp — private: the instruction-set targets of dissect's
// kernels.
//
// Programs using dissect are built for plain x86-64, so each SIMD kernel carries its own target
// attribute and is chosen at run time (kernels/cpu_dispatch.hpp): a default-flags build still runs
// AVX-512 where the CPU has it. Off x86 (or off GCC/Clang) only the portable paths exist.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/simd_targets.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DISSECT_X86 1
#include <immintrin.h>
#define DISSECT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DISSECT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define DISSECT_TARGET_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define DISSECT_TARGET_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#else
#define DISSECT_X86 0
#endif

// GCC 12's own AVX-512 intrinsics (_mm512_undefined_* passthroughs) trip its (maybe-)uninitialized
// warnings wherever they are inlined (GCC PR 105593). Each AVX-512 header brackets its kernels
// with these two, which silence them there and nowhere else.
#if defined(__GNUC__) && !defined(__clang__)
#define DISSECT_AVX512_WARNINGS_BEGIN                                                  \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DISSECT_AVX512_WARNINGS_END _Pragma("GCC diagnostic pop")
#else
#define DISSECT_AVX512_WARNINGS_BEGIN
#define DISSECT_AVX512_WARNINGS_END
#endif
