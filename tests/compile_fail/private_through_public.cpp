// Must compile: a private header reached through its public header is fine, so the two
// private_* compile-fail tests fail for the check, not for a broken include path.
#include <dissect/kernels/gemm.hpp>
// (kept apart so that include sorting leaves the public header first)
#include <dissect/kernels/detail/gemm_driver.hpp>
int main() {}
