// transformer_layer — the lesson's §8 shape chain measured on real tensors: one GPT-2 layer.
//
// Builds a GPT-2 model with GPT-2 small's sizes (D = 768, H = 12, V = 50257) but one layer,
// runs it on B×T random token ids, and records the shape of every stage as it runs. Each
// recorded shape is then checked against forward_shape_chain — the table the budget tool and the
// shape_chain example print — stage by stage, with the FLOPs of each, so the table is a
// measurement here, not a drawing. Sampling (greedy, the argmax of each row of logits) closes
// the chain.
#include <dissect/accounting/config.hpp>
#include <dissect/accounting/forward_chain.hpp>
#include <dissect/accounting/shape_chain.hpp>
#include <dissect/models/decoder_model.hpp>
#include <dissect/tensor/init.hpp>
#include <dissect/training/loss.hpp>

#include <chrono>
#include <iostream>
#include <vector>

#include "common/cli.hpp"
#include "tools/common/chain_table.hpp"

namespace {

using dissect::index_t;

int run(index_t batch, index_t tokens, std::uint64_t seed) {
  dissect::TransformerConfig config = dissect::find_preset("gpt2-small").config;
  config.n_layers = 1;
  std::cout << "One GPT-2 layer (GPT-2 small's sizes, L = 1) on B = " << batch
            << " sequences of T = " << tokens << " random token ids\n\n";
  const dissect::GPT2Model<float> model(config, {.seed = seed});

  dissect::Generator generator(seed + 1);
  std::vector<index_t> ids(static_cast<std::size_t>(batch * tokens));
  for (auto& id : ids) id = static_cast<index_t>(generator.uniform() * double(config.vocab));

  dissect::ShapeTrace trace;
  const auto start = std::chrono::steady_clock::now();
  const auto logits = model.forward(dissect::TokenBatch{ids, batch, tokens}, &trace);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto next = dissect::argmax(logits.cview().reshape(dissect::Shape<2>{-1, config.vocab}));
  trace.push_back({"sampling", {batch, tokens}});

  // The table, and the same steps re-checked against the measured shapes: expect() throws
  // naming the stage if a measured shape differs from the table's.
  const dissect::ShapeChain table = dissect::forward_shape_chain(config, batch, tokens);
  dissect::ShapeChain measured(table.dims());
  for (std::size_t i = 0; i < table.steps().size(); ++i) {
    const dissect::ChainStep& step = table.steps()[i];
    if (i >= trace.size() || trace[i].stage != step.stage) {
      std::cerr << "the forward pass did not record stage \"" << step.stage << "\"\n";
      return dissect::examples::kExitFailure;
    }
    measured.expect(step.stage, trace[i].shape, step.shape.symbolic_text(), step.operation,
                    step.cost);
  }
  std::cout << dissect::tools::chain_table(measured) << "\n";
  std::cout << "every one of the " << measured.steps().size()
            << " measured shapes equals forward_shape_chain's\n";
  std::cout << "forward: " << dissect::format_count(table.total_flops()) << " FLOPs in "
            << seconds * 1e3 << " ms (" << double(table.total_flops()) / seconds * 1e-9
            << " GFLOP/s); greedy next token after position 0: " << next.front() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Runs one GPT-2 layer on real tensors and checks each stage's shape against the "
      "forward shape chain, with its FLOPs."};
  index_t batch = 1, tokens = 64;
  std::uint64_t seed = 2024;
  app.add_option("--batch", batch, "sequences B")->check(CLI::Range(1, 64));
  app.add_option("--tokens", tokens, "tokens T per sequence (at most 1024)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--seed", seed, "seed of the weights and the token ids");
  app.footer(dissect::examples::kExitStatusHelp);
  if (auto status = dissect::examples::parse_command_line(app, argc, argv)) return *status;
  return dissect::examples::run_program(app.get_name(), [&] { return run(batch, tokens, seed); });
}
