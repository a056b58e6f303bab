// src/kernels.cpp — dissect's kernels compiled once for a program whose translation units all
// define DISSECT_SEPARATE_KERNELS (see include/dissect/kernels/compile_once.hpp). Compile it with
// the program's flags; the CMake build of dissect's own programs does (DISSECT_SEPARATE_KERNELS).
#define DISSECT_KERNELS_IMPLEMENTATION
#include "dissect/kernels/gemm.hpp"
#include "dissect/quant/weight_format.hpp"
