// Must compile: proves the compile-fail tests fail for their static_assert, not for a broken
// include path or flags.
#include <dissect/layers/linear.hpp>
int main() {
  dissect::Linear<float> layer(4, 3);
  dissect::Tensor<float, 2> x({2, 4});
  (void)layer.forward(x);
}
