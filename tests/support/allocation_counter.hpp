// tests/support/allocation_counter.hpp — how many times operator new has run, for the tests that
// prove a hot path allocates nothing once its buffers have grown (test_gemm, test_optim).
//
// support/counting_new.cpp replaces the global operator new and delete of the binaries that link
// it (tests/CMakeLists.txt's `allocations` group) with malloc and free plus one relaxed atomic
// increment. Only those binaries count: the replacement hides new/delete mismatches from
// AddressSanitizer, so the rest of the suite keeps the sanitizer's own operators.
#pragma once

namespace dissect::testing {

/// operator new calls in this binary so far (every thread's; gtest runs tests on one thread).
long allocation_count();

}  // namespace dissect::testing
