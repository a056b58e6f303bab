// Shared by the benchmark binaries: the run's context (threads, backends, SIMD, compiler, flags),
// the shape lists with the reason each matters, counters, thread control, and the one-time
// check of each kernel against the naive reference before it is timed.
#pragma once

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "dissect/kernels/linear_products.hpp"
#include "dissect/layers/linear.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif
#if DISSECT_BENCH_CBLAS
#include <cblas.h>
#endif

namespace dissect::bench {

struct LinearShape {
  index_t in;
  index_t out;
  const char* why;
};

// GPT-2 small (D = 768): the fused c_attn, c_proj, and the two halves of the MLP.
// LLaMA-7B class (D = 4096): attention projections, SwiGLU up/gate (11008) and down.
inline const std::vector<LinearShape> gpt2_shapes = {
    {768, 2304, "GPT-2 c_attn: fused Q, K, V projection"},
    {768, 768, "GPT-2 c_proj: attention output projection"},
    {768, 3072, "GPT-2 MLP up (D -> 4D)"},
    {3072, 768, "GPT-2 MLP down (4D -> D)"},
};
inline const std::vector<LinearShape> llama7b_shapes = {
    {4096, 4096, "7B q/k/v/o projection"},
    {4096, 11008, "7B FFN up/gate: the shape where stock Eigen fell off a cliff"},
    {11008, 4096, "7B FFN down"},
};

/// TinyLlama-1.1B's products at prefill (D 2048, H_kv·d_k 256, F 5632): what `dissect generate`
/// runs per layer, the GEMM rate its whole-model prefill is compared with (bench/README.md).
inline const std::vector<LinearShape> tinyllama_shapes = {
    {2048, 2560, "TinyLlama qkv (q 2048 + k 256 + v 256 rows, one product)"},
    {2048, 2048, "TinyLlama o projection"},
    {2048, 5632, "TinyLlama FFN gate and up (two products each)"},
    {5632, 2048, "TinyLlama FFN down"},
};

/// Prints what ran: threads, OpenMP, BLAS, Eigen's SIMD, compiler and flags.
inline void print_context() {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  const char* openmp = "on";
#else
  const int threads = 1;
  const char* openmp = "off (single-threaded build)";
#endif
#ifdef EIGEN_USE_BLAS
  const char* eigen_blas = "on (EIGEN_USE_BLAS: Eigen's GEMM calls the BLAS)";
#else
  const char* eigen_blas = "off (Eigen's own GEMM)";
#endif
#if DISSECT_BENCH_CBLAS
  const char* cblas = "linked (cblas_* baselines present)";
#else
  const char* cblas = "not linked (no cblas_* baselines)";
#endif
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("dissect benchmark context\n");
  std::printf("  max threads        %d (OpenMP %s)\n", threads, openmp);
  std::printf("  Eigen %d.%d.%d SIMD   %s\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
              EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse());
  std::printf("  Eigen -> BLAS      %s\n  BLAS baseline      %s\n", eigen_blas, cblas);
  std::printf("  OPENBLAS_CORETYPE  %s\n", coretype ? coretype : "(unset)");
  std::printf("  compiler           %s\n  flags              %s\n\n", __VERSION__,
              DISSECT_BENCH_FLAGS);
  std::fflush(stdout);
}

/// Sets the thread count for dissect, Eigen and OpenBLAS alike; returns what was set.
inline int use_threads(int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);
#if defined(OPENBLAS_VERSION)
  openblas_set_num_threads(threads);  // OpenBLAS keeps its own pool; OMP settings do not bound it
#endif
  return threads;
}

inline std::string context_label(int threads) {
  std::string label = std::to_string(threads) + (threads == 1 ? " thread" : " threads");
#ifndef _OPENMP
  label += " (no OpenMP)";
#endif
  return label;
}

/// GFLOP/s from flops per iteration (the counter prints e.g. "131.5G/s").
inline void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

/// Weight bytes read per second: the figure of merit when M is small and the layer is a GEMV.
inline void set_weight_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.counters["weights B/s"] =
      benchmark::Counter(bytes_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

template <std::size_t Rank>
Tensor<float, Rank> random_tensor(const Shape<Rank>& shape, std::uint64_t seed) {
  Tensor<float, Rank> tensor(shape);
  Generator generator(seed);
  fill_uniform(tensor, -1.0, 1.0, generator);
  return tensor;
}

/// Compares a few rows of `fast` with the naive kernel (all rows would take minutes at 7B sizes).
/// A wrong kernel must not produce a number, so a mismatch aborts the run.
inline void verify_rows(const char* what, const Tensor<float, 2>& x,
                        ConstTensorView<float, 2> weight, ConstTensorView<float, 1> bias,
                        const Tensor<float, 2>& fast) {
  const index_t rows = x.dim(0), in = x.dim(1), out = weight.dim(0);
  for (index_t row : {index_t{0}, rows / 2, rows - 1}) {
    for (index_t n = 0; n < out; ++n) {
      double exact = bias(n), scale = std::abs(bias(n));
      for (index_t k = 0; k < in; ++k) {
        exact += double(x(row, k)) * weight(n, k);
        scale += std::abs(double(x(row, k)) * weight(n, k));
      }
      const double bound = 2.0 * double(in + 1) * 0x1.0p-24 * scale + 1e-30;
      if (!(std::abs(fast(row, n) - exact) <= bound)) {
        std::fprintf(stderr, "%s: wrong result at [%td, %td]: %g vs %g\n", what, row, n,
                     double(fast(row, n)), exact);
        std::exit(1);
      }
    }
  }
}

/// A benchmark binary's main: the context first, then the benchmarks `register_all` adds.
inline int run_benchmarks(int argc, char** argv, void (*register_all)()) {
  print_context();
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace dissect::bench
