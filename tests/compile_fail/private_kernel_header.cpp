// Must not compile: a private header of the kernels, included on its own, names the public
// header to include instead (Eigen's InternalHeaderCheck is the model).
#include <dissect/kernels/detail/gemm_driver.hpp>
int main() {}
