// A consumer's first program: if this builds, links and prints the right layer, the way it
// found dissect works.
#include <dissect/layers/linear.hpp>
#include <iostream>
#include <sstream>

int main() {
  dissect::Linear<float> layer(768, 3072, {.seed = 1});
  dissect::Tensor<float, 3> x({2, 5, 768});
  const auto y = layer.forward(x);
  std::ostringstream text;
  text << layer;
  std::cout << text.str() << " -> " << dissect::format_shape(y.shape()) << "\n";
  return text.str() == "Linear(in_features=768, out_features=3072, bias=true)" &&
                 y.shape() == dissect::Shape<3>{2, 5, 3072}
             ? 0
             : 1;
}
