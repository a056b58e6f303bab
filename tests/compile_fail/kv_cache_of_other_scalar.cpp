// Must not compile: a float KV cache for a double model (issue 11, "mismatched dtypes").
#include <dissect/models/decoder_model.hpp>
int main() {
  dissect::TransformerConfig config{
      .d_model = 8, .n_layers = 1, .n_heads = 2, .d_ff = 16, .vocab = 11, .context = 4};
  dissect::GPT2Model<double> model(config);
  dissect::KVCache<float> cache(config, 1);
  const dissect::index_t ids[] = {1};
  (void)model.forward(dissect::TokenBatch{ids, 1, 1}, cache);
}
