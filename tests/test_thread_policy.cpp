// Tests of dissect/core/thread_policy.hpp: the one rule every product forks threads by, and its
// four thresholds. The thread counts must be the ones the kernels computed before they shared the
// rule (issue 50): each threshold is checked on both sides, and the two callers with more to
// them than the rule (the packed GEMM's count, Eigen's panels' count) are checked against their
// old formulas, copied here verbatim, over a grid of shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "dissect/core/thread_policy.hpp"
#include "dissect/kernels/gemm.hpp"
#include "dissect/kernels/linear_products.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dissect {
namespace test_thread_policy {

using thread_policy::threads_for;

// The values the kernels held as literals (quant_tiles.hpp's 2^15, panelled_gemm.hpp's 2^16,
// gemm.hpp's and the VNNI and bf16 GEMMs' 2^21).
static_assert(thread_policy::min_quantized_weights == 32768);
static_assert(thread_policy::min_streamed_values == 65536);
static_assert(thread_policy::min_gemm_flops == 2097152);
static_assert(thread_policy::min_multiply_adds == 2097152);

TEST(ThreadPolicy, OneThreadPerThresholdAtLeastOneAtMostTheLimit) {
  for (const index_t t : {thread_policy::min_quantized_weights, thread_policy::min_streamed_values,
                          thread_policy::min_gemm_flops, thread_policy::min_multiply_adds}) {
    SCOPED_TRACE(t);
    EXPECT_EQ(threads_for(0, t, 8), 1);
    EXPECT_EQ(threads_for(t - 1, t, 8), 1);
    EXPECT_EQ(threads_for(t, t, 8), 1);
    EXPECT_EQ(threads_for(2 * t - 1, t, 8), 1);
    EXPECT_EQ(threads_for(2 * t, t, 8), 2);
    EXPECT_EQ(threads_for(8 * t - 1, t, 8), 7);
    EXPECT_EQ(threads_for(8 * t, t, 8), 8);
    EXPECT_EQ(threads_for(1000 * t, t, 8), 8);
    EXPECT_EQ(threads_for(1000 * t, t, 1), 1);
  }
  // As the kernels count: a 2048 × 1024 weight in q4_K decodes on 64 threads' worth of weights;
  // its prefill GEMM at m = 1 is one thread's multiply-adds, at m = 3 three.
  EXPECT_EQ(threads_for(2048 * 1024, thread_policy::min_quantized_weights, 128), 64);
  EXPECT_EQ(threads_for(1 * 2048 * 1024, thread_policy::min_multiply_adds, 8), 1);
  EXPECT_EQ(threads_for(3 * 2048 * 1024, thread_policy::min_multiply_adds, 8), 3);
}

/// gemm.hpp's gemm_threads before this header, with `available` for OpenMP's count.
int old_gemm_threads(const kernels::detail::GemmCall& call, int requested, int available) {
  int threads = requested;
  if (threads == 0) threads = available;
  const index_t pairs = (call.panels() + 1) / 2;
  const index_t k = std::max<index_t>(call.k, 1);
  const index_t flops = std::max<index_t>(2 * call.m, 32) * call.n * k;
  const index_t useful = std::max<index_t>(1, std::min(pairs, flops / (index_t{1} << 21)));
  return static_cast<int>(std::clamp<index_t>(useful, 1, threads));
}

/// panelled_gemm.hpp's threads_for_weights before this header (outside a parallel region).
int old_threads_for_weights(index_t streamed_values, int available) {
  const index_t useful = std::max<index_t>(1, streamed_values / (index_t{1} << 16));
  return static_cast<int>(std::min<index_t>(useful, available));
}

TEST(ThreadPolicy, TheGemmAndThePanelsCountAsBefore) {
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(6);
  const int available = 6;
#else
  const int available = 1;
#endif
  EXPECT_EQ(thread_policy::available_threads(), available);
  const std::vector<index_t> sizes = {0,   1,   2,   15,  16,   17,   31,   32,   33,   64,
                                      100, 511, 512, 513, 1024, 2047, 2048, 4096, 4097, 11008};
  for (const index_t m : sizes) {
    for (const index_t n : sizes) {
      for (const index_t k : sizes) {
        kernels::detail::GemmCall call;
        call.m = m;
        call.n = n;
        call.k = k;
        for (const int requested : {0, 1, 2, 3, 8}) {
#ifdef _OPENMP
          ASSERT_EQ(kernels::detail::gemm_threads(call, requested),
                    old_gemm_threads(call, requested, available))
              << "m " << m << ", n " << n << ", k " << k << ", requested " << requested;
#else
          ASSERT_EQ(kernels::detail::gemm_threads(call, requested), 1);
#endif
        }
      }
      ASSERT_EQ(detail::threads_for_weights(m * n), old_threads_for_weights(m * n, available))
          << m << " × " << n;
    }
  }
  for (const index_t v : {index_t{1} << 16, (index_t{1} << 17) - 1, index_t{1} << 17,
                          index_t{6} << 16, index_t{1} << 30}) {
    EXPECT_EQ(detail::threads_for_weights(v), old_threads_for_weights(v, available)) << v;
  }
#ifdef _OPENMP
  // Inside a parallel region: one thread, whatever the work.
  int team = 0, inside = 0, inside_gemm = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      team = omp_get_num_threads();
      inside = detail::threads_for_weights(index_t{1} << 30);
      kernels::detail::GemmCall call;
      call.m = call.n = call.k = 4096;
      inside_gemm = kernels::detail::gemm_threads(call, 0);
    }
  }
  if (team > 1) {  // an active region (OpenMP may give a team of one)
    EXPECT_EQ(inside, 1);
    EXPECT_EQ(inside_gemm, 1);
  }
  omp_set_num_threads(saved);
#endif
}

}  // namespace test_thread_policy
}  // namespace dissect
