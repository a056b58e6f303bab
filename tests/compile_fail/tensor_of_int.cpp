// Must not compile: a Tensor of integers.
#include <dissect/tensor/tensor.hpp>
int main() {
  dissect::Tensor<int, 2> t({2, 2});
}
