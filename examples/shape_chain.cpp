// shape_chain — the lesson's §8 shape chain, printed and then checked on real tensors.
//
// Prints the forward shape chain, with the FLOPs of each step, for the lesson's toy and for
// GPT-2 small. Then it makes the mistake the lesson warns about — Q reshaped to [B, T, H, d_k]
// with the transpose forgotten — and prints what dissect says; and last, the H = T case, where
// no check on sizes can see the mistake and the chain reports that it is blind instead.
#include <dissect/accounting/config.hpp>
#include <dissect/accounting/forward_chain.hpp>
#include <dissect/accounting/shape_chain.hpp>
#include <dissect/layers/linear.hpp>
#include <dissect/tensor/init.hpp>
#include <dissect/tensor/tensor.hpp>

#include <iostream>

#include "tools/common/chain_table.hpp"

using dissect::index_t;
using dissect::ShapeChain;
using dissect::Tensor;
using dissect::tools::chain_table;

namespace {

/// X [B, T, D] through a real W_Q, split into heads by a reshape alone, and checked against
/// [B, H, T, d_k]. Returns whether the check threw.
bool forget_the_transpose(index_t batch, index_t tokens, index_t width, index_t heads,
                          ShapeChain& chain) {
  const index_t d_k = width / heads;
  Tensor<float, 3> x({batch, tokens, width});
  dissect::Generator generator(2024);
  dissect::fill_uniform(x, -1, 1, generator);
  const dissect::Linear<float> w_q(width, width, {.bias = false, .seed = 7});
  const Tensor<float, 3> q = w_q.forward(x);
  chain.expect("QKV projection", q, "B T D", "X·W_Q",
               {2 * batch * tokens * width * width, false, dissect::StepKind::linear});
  // The mistake: D is split into H heads of d_k, but T and H stay in the order they came in.
  const Tensor<float, 4> split = q.reshape(dissect::Shape<4>{batch, tokens, heads, d_k});
  try {
    chain.expect("head split", split, "B H T d_k", "reshape (transpose forgotten)");
    std::cout << "  passed: " << dissect::format_shape(split.shape()) << " went through\n";
    return false;
  } catch (const dissect::ShapeError& error) {
    std::cout << "  caught: " << error.what() << "\n";
    return true;
  }
}

}  // namespace

int main() {
  // The lesson's NumPy check uses B = 2, T = 5, D = 8, H = 2; V = 100 as in the issue, and F = 4D,
  // L = 2 complete a GPT-2-style model.
  dissect::TransformerConfig toy;
  toy.d_model = 8;
  toy.n_layers = 2;
  toy.n_heads = 2;
  toy.d_ff = 32;
  toy.vocab = 100;
  toy.context = 16;
  std::cout << "== 1. The lesson's toy: B = 2, T = 5, D = 8, H = 2, V = 100 (F = 4D, L = 2)\n\n"
            << chain_table(dissect::forward_shape_chain(toy, 2, 5)) << "\n";

  std::cout << "== 2. GPT-2 small: B = 1, T = 1024, D = 768, H = 12, V = 50257\n\n"
            << chain_table(
                   dissect::forward_shape_chain(dissect::find_preset("gpt2-small").config, 1, 1024))
            << "\n";

  std::cout << "== 3. Forgetting the transpose: Q reshaped to [B, T, H, d_k]\n\n"
            << "With B = 3, T = 5, D = 8, H = 2 every size differs, so one reading fits:\n";
  ShapeChain distinct({{"B", 3}, {"T", 5}, {"D", 8}, {"H", 2}, {"d_k", 4}});
  const bool caught_distinct = forget_the_transpose(3, 5, 8, 2, distinct);
  std::cout << "In the lesson's toy B = H = 2, so two readings fit and both are listed:\n";
  ShapeChain lesson({{"B", 2}, {"T", 5}, {"D", 8}, {"H", 2}, {"d_k", 4}});
  const bool caught_lesson = forget_the_transpose(2, 5, 8, 2, lesson);

  std::cout << "\n== 4. H = T: the same mistake with B = 2, T = 3, D = 12, H = 3\n\n"
            << "[B, H, T, d_k] and [B, T, H, d_k] are both [2, 3, 3, 4]; no check on sizes can\n"
            << "tell them apart, so the chain records the step with its blind spot:\n";
  ShapeChain blind({{"B", 2}, {"T", 3}, {"D", 12}, {"H", 3}, {"d_k", 4}});
  const bool caught_blind = forget_the_transpose(2, 3, 12, 3, blind);
  std::cout << "\n" << chain_table(blind);

  const bool as_expected = caught_distinct && caught_lesson && !caught_blind &&
                           !blind.steps().back().blind_spots.empty();
  std::cout << "\n"
            << (as_expected ? "OK: both mistakes caught, and the blind check reported as blind\n"
                            : "UNEXPECTED: see above\n");
  return as_expected ? 0 : 1;
}
