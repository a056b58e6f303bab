// tests/support/sanitizers.hpp — DISSECT_TEST_SANITIZED: whether this test unit is built with
// AddressSanitizer. GCC defines __SANITIZE_ADDRESS__; clang says so only through
// __has_feature(address_sanitizer). Tests shrink their sweeps and corpora under the sanitizers
// (an unoptimised, instrumented build runs a naive reference ~30× slower), so both compilers
// must be seen alike.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define DISSECT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DISSECT_TEST_SANITIZED 1
#endif
#endif
