// A consumer's first program: if this builds, links and prints the right layer, the way it
// found dissect works.
#include <dissect/layers/linear.hpp>
#include <iostream>
#include <sstream>

// dissect::dissect compiles the SIMD kernels once, in the dissect_kernels library it links, and
// tells every unit so; with DISSECT_HEADER_ONLY, each unit compiles them itself.
#if defined(CONSUMER_EXPECTS_HEADER_ONLY) == defined(DISSECT_SEPARATE_KERNELS)
#error \
    "dissect::dissect should define DISSECT_SEPARATE_KERNELS exactly when DISSECT_HEADER_ONLY is off"
#endif

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
