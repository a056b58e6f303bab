// Must not compile: a Linear of integers (reliability.md row 13).
#include <dissect/layers/linear.hpp>
int main() {
  dissect::Linear<int> layer(4, 3);
}
