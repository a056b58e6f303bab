// Must not compile: a Tensor<double> into a Linear<float> (reliability.md row 13).
#include <dissect/layers/linear.hpp>
int main() {
  dissect::Linear<float> layer(4, 3);
  dissect::Tensor<double, 2> x({2, 4});
  (void)layer.forward(x);
}
