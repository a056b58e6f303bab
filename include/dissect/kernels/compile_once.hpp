// dissect/kernels/compile_once.hpp — where the kernels' entry points are compiled: in every
// translation unit (the default: dissect is header-only), or once for a whole program.
//
// A translation unit that multiplies reaches, through the run-time dispatch, every SIMD kernel
// dissect has (the GEMM tiles of each path, the bf16/int8/q4_0 and ggml block tiles): ~230
// functions, about 15 s of GCC -O2 code generation in each such unit. A program of many units
// can compile them once: define DISSECT_SEPARATE_KERNELS in every one of its units, and compile
// src/kernels.cpp (which also defines DISSECT_KERNELS_IMPLEMENTATION) into it once, with the same
// flags. The entry points are then declared in the headers and defined in that one unit; nothing
// else changes, and the kernels' code is the same (the SIMD paths carry their own target
// attributes, so the unit's -march only matters for the portable path). CMake users get this by
// default: dissect::dissect carries the definition and links dissect_kernels, src/kernels.cpp
// built once (DISSECT_HEADER_ONLY turns it off); dissect's own tests, examples, tools and
// benchmarks build one such unit per set of flags (CMake option DISSECT_SEPARATE_KERNELS).
#pragma once

#if defined(DISSECT_KERNELS_IMPLEMENTATION) && !defined(DISSECT_SEPARATE_KERNELS)
#error \
    "DISSECT_KERNELS_IMPLEMENTATION (src/kernels.cpp) needs DISSECT_SEPARATE_KERNELS, defined in every translation unit of the program"
#endif

/// 1 where this unit compiles the kernels' entry points (header-only, or src/kernels.cpp); 0
/// where it only declares them (DISSECT_SEPARATE_KERNELS elsewhere).
#if defined(DISSECT_SEPARATE_KERNELS) && !defined(DISSECT_KERNELS_IMPLEMENTATION)
#define DISSECT_KERNEL_BODIES 0
#else
#define DISSECT_KERNEL_BODIES 1
#endif

/// How an entry point is defined: inline in the header-only build, with external linkage in the
/// one unit that compiles them for the program.
#ifdef DISSECT_KERNELS_IMPLEMENTATION
#define DISSECT_KERNEL_ENTRY
#else
#define DISSECT_KERNEL_ENTRY inline
#endif
