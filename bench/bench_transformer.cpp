// bench_transformer — whole models, float32, 1 and 2 threads, tokens per second:
//
// - prefill: GPT-2 small's forward over T = 128 and 512 prompt tokens (B = 1), logits included;
//   also with the model packed (gpt2-small-packed: the packed GEMM with fused epilogues);
// - decode: one token after a KV cache already holding C = 128 or 1023 positions (GPT-2's
//   context is 1024); the cache is filled once, before timing, and each iteration decodes one
//   token and then truncates the cache back to C, so every iteration times the same step;
// - the same two at LLaMA-7B shapes with one layer: a LlamaModel with n_layers = 1 and a
//   256-token vocabulary, so the embedding, the final norm and the head are negligible next to
//   the layer (D = 4096, H = 32, F = 11008, RoPE, RMSNorm, SwiGLU, no biases);
// - causal attention alone, B = 1, H = 12, d_k = 64, T = 512, 2048, 4096: causal_attention
//   (online softmax) against a naive baseline that materialises each head's [T, T] scores.
//
// GFLOP/s follow the library's definitions: forward_flops (the full T×T attention square) for
// prefill, causal_attention_flops (the causal triangle) for attention alone and for the
// attention of a decoding step. Decode also reports the weight bytes streamed per second.
// Each model is built once, on first use, and shared by its benchmarks (GPT-2 small draws 124M
// normals), and so is each filled KV cache; inside a timed loop only forward itself allocates.
// Before anything is timed, decoding is checked against a full forward and causal_attention
// against double precision and the baseline; a wrong result aborts the run.
//
//   bench_transformer --benchmark_filter='decode/' --benchmark_repetitions=3
//   bench/compare_torch.py --dissect build/bench/bench/bench_transformer   # the same in PyTorch
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "dissect/accounting/model_shape.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/models/decoder_model.hpp"

namespace dissect::bench {
namespace {

// ---- the models ---------------------------------------------------------------------------------

const TransformerConfig& gpt2_config() {
  return find_preset("gpt2-small").config;
}

/// LLaMA-7B's layer shapes in a one-layer model whose head (256 × 4096) costs 0.1 % of the layer.
const TransformerConfig& llama_layer_config() {
  static const TransformerConfig config = [] {
    TransformerConfig c = find_preset("llama-7b").config;
    c.n_layers = 1;
    c.vocab = 256;
    return c;
  }();
  return config;
}

/// Built on first use, then shared: forward is const, and building is the slow part of a run.
const GPT2Model<float>& gpt2_model() {
  static const GPT2Model<float> model(gpt2_config(), ModelOptions{.seed = 1});
  return model;
}

/// GPT-2 small again, packed for inference (DecoderModel::pack): fused epilogues on the packed
/// GEMM. The tied head stays unpacked (it is the embedding).
const GPT2Model<float>& gpt2_packed_model() {
  static const GPT2Model<float> model = [] {
    GPT2Model<float> packed = gpt2_model();
    packed.pack();
    return packed;
  }();
  return model;
}

const LlamaModel<float>& llama_layer_model() {
  static const LlamaModel<float> model(llama_layer_config(), ModelOptions{.seed = 2});
  return model;
}

std::vector<index_t> random_ids(index_t count, index_t vocab, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<index_t> id(0, vocab - 1);
  std::vector<index_t> ids(static_cast<std::size_t>(count));
  for (auto& value : ids) value = id(engine);
  return ids;
}

/// Bytes of weights one decoded token reads: every multiplied matrix once, the tied head
/// included (it is read whether or not it is the embedding). Biases, norm weights and the two
/// embedding rows looked up (< 0.1 % for both models) are left out, and so is the KV cache.
double weight_bytes_per_token(const TransformerConfig& config) {
  return double(forward_shape(config).linear_weights) * sizeof(float);
}

/// One decoding step's FLOPs after `context` positions: every weight once (2·W) and, in each
/// layer, attention's two products for one query over context + 1 keys.
double decode_flops(const TransformerConfig& config, index_t context) {
  const double attention =
      double(causal_attention_flops(1, config.n_heads, 1, context + 1, config.head_size()));
  return 2.0 * double(forward_shape(config).linear_weights) + double(config.n_layers) * attention;
}

void set_tokens(benchmark::State& state, index_t tokens_per_iteration) {
  state.counters["tokens_per_second"] = benchmark::Counter(
      double(tokens_per_iteration) * double(state.iterations()), benchmark::Counter::kIsRate);
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(1);
}

/// max |a − b| over max |b|: how far two logit tensors are apart, relative to their scale.
double relative_distance(ConstTensorView<float, 1> a, ConstTensorView<float, 1> b) {
  double distance = 0, scale = 0;
  for (index_t i = 0; i < a.size(); ++i) {
    distance = std::max(distance, std::abs(double(a(i)) - double(b(i))));
    scale = std::max(scale, std::abs(double(b(i))));
  }
  return distance / scale;
}

struct ModelCase {
  const char* name;  // "gpt2-small", "llama-7b-layer"
  const char* what;  // for the label
  index_t tokens;    // prefill: T; decode: the context C already in the cache
  int threads;
};

template <class Model>
void prefill(benchmark::State& state, const Model& (*model_of)(), ModelCase c) {
  use_threads(c.threads);
  const Model& model = model_of();
  const auto ids = random_ids(c.tokens, model.config().vocab, 11);
  const TokenBatch prompt{ids, 1, c.tokens};
  for (auto _ : state) {
    auto logits = model.forward(prompt);
    benchmark::DoNotOptimize(logits.data());
    benchmark::ClobberMemory();
  }
  set_tokens(state, c.tokens);
  set_flops(state, double(forward_flops(model.config(), 1, c.tokens).total));
  state.SetLabel(context_label(c.threads) + ", " + c.what);
}

/// A KV cache holding `context` positions of a random prompt, and the token that follows it.
struct FilledCache {
  std::vector<index_t> ids;  // context + 1 ids: the prompt, then the token to decode
  KVCache<float> kv;

  TokenBatch next() const { return {std::span<const index_t>(ids).last(1), 1, 1}; }
};

/// The cache for (model, context), filled by a prefill on first use and then shared by the
/// benchmarks at every thread count: each leaves it as it found it (truncate), and filling it
/// is most of a decode benchmark's set-up (a 1024-token prefill). Checked once, when filled:
/// the same step decoded twice (truncating in between) gives the same bits, and, where a full
/// forward is cheap (C <= 128), the step's logits match the last row of a forward over all
/// C + 1 tokens.
template <class Model>
FilledCache& filled_cache(const Model& model, const char* name, index_t context) {
  static std::map<index_t, FilledCache> caches;
  if (auto found = caches.find(context); found != caches.end()) return found->second;
  FilledCache& filled =
      caches
          .emplace(context, FilledCache{random_ids(context + 1, model.config().vocab, 12),
                                        model.make_kv_cache(1)})
          .first->second;
  const std::span<const index_t> all(filled.ids);
  model.forward(TokenBatch{all.first(std::size_t(context)), 1, context}, filled.kv);

  const auto step = model.forward(filled.next(), filled.kv);
  filled.kv.truncate(context);
  const auto again = model.forward(filled.next(), filled.kv);
  filled.kv.truncate(context);
  if (!std::equal(step.data(), step.data() + step.size(), again.data())) {
    fail(std::string(name) + ": decoding the same step after truncate changed the logits");
  }
  if (context <= 128) {
    const auto full = model.forward(TokenBatch{all, 1, context + 1});
    const index_t vocab = model.config().vocab;
    const ConstTensorView<float, 1> last(full.data() + context * vocab, Shape<1>{vocab});
    const double distance = relative_distance(step.cview().flatten(), last);
    if (!(distance < 1e-4)) {
      fail(std::string(name) + ": decoded logits differ from the full forward's by " +
           std::to_string(distance) + " of their scale");
    }
  }
  return filled;
}

template <class Model>
void decode(benchmark::State& state, const Model& (*model_of)(), ModelCase c) {
  use_threads(c.threads);
  const Model& model = model_of();
  const index_t context = c.tokens;
  FilledCache& filled = filled_cache(model, c.name, context);
  const TokenBatch next = filled.next();
  for (auto _ : state) {
    auto logits = model.forward(next, filled.kv);
    filled.kv.truncate(context);
    benchmark::DoNotOptimize(logits.data());
    benchmark::ClobberMemory();
  }
  set_tokens(state, 1);
  set_weight_bytes(state, weight_bytes_per_token(model.config()));
  set_flops(state, decode_flops(model.config(), context));
  state.SetLabel(context_label(c.threads) + ", " + c.what);
}

// ---- attention alone ----------------------------------------------------------------------------

constexpr index_t attention_heads = 12, attention_head_dim = 64;  // GPT-2 small's heads

struct AttentionInputs {
  explicit AttentionInputs(index_t tokens)
      : q(random_tensor<4>({1, attention_heads, tokens, attention_head_dim}, 21)),
        k(random_tensor<4>({1, attention_heads, tokens, attention_head_dim}, 22)),
        v(random_tensor<4>({1, attention_heads, tokens, attention_head_dim}, 23)) {}
  Tensor<float, 4> q, k, v;
};

/// The textbook kernel: per head, scores = q·kᵀ·scale as a full [T, T] matrix, the causal mask,
/// a row-wise softmax, then scores·v. Heads are shared among the threads as causal_attention
/// shares them; each thread owns one [T, T] buffer (allocated by the caller, once).
void materialised_attention(const AttentionInputs& in, Tensor<float, 4>& out,
                            std::vector<RowMatrix<float>>& scores) {
  const index_t heads = in.q.dim(1), tokens = in.q.dim(2), d_k = in.q.dim(3);
  const float scale = float(1.0 / std::sqrt(double(d_k)));
  const auto head = [&](const Tensor<float, 4>& x, index_t h) {
    return ConstMatrixMap<float>(x.data() + h * tokens * d_k, tokens, d_k);
  };
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (index_t h = 0; h < heads; ++h) {
#ifdef _OPENMP
    RowMatrix<float>& s = scores[std::size_t(omp_get_thread_num())];
#else
    RowMatrix<float>& s = scores[0];
#endif
    s.noalias() = head(in.q, h) * head(in.k, h).transpose();
    for (index_t t = 0; t < tokens; ++t) {
      auto row = s.row(t).head(t + 1);  // query t sees keys 0 … t
      row *= scale;
      row = (row.array() - row.maxCoeff()).exp().matrix();
      row /= row.sum();
      s.row(t).tail(tokens - t - 1).setZero();
    }
    MatrixMap<float>(out.data() + h * tokens * d_k, tokens, d_k).noalias() = s * head(in.v, h);
  }
}

/// Checks `out` against attention computed in double for three rows of the first and last head:
/// the error bound is that of float sums of T + d_k terms, each at most 1 in magnitude.
void verify_attention(const char* what, const AttentionInputs& in, const Tensor<float, 4>& out) {
  const index_t heads = in.q.dim(1), tokens = in.q.dim(2), d_k = in.q.dim(3);
  const double scale = 1.0 / std::sqrt(double(d_k));
  const double bound = 4.0 * double(tokens + d_k) * 0x1.0p-24;
  for (index_t h : {index_t{0}, heads - 1}) {
    for (index_t t : {index_t{0}, tokens / 2, tokens - 1}) {
      std::vector<double> weight(std::size_t(t + 1));
      double max_score = -INFINITY, sum = 0;
      for (index_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (index_t i = 0; i < d_k; ++i) dot += double(in.q(0, h, t, i)) * in.k(0, h, j, i);
        weight[std::size_t(j)] = dot * scale;
        max_score = std::max(max_score, dot * scale);
      }
      for (auto& w : weight) sum += (w = std::exp(w - max_score));
      for (index_t i = 0; i < d_k; ++i) {
        double exact = 0;
        for (index_t j = 0; j <= t; ++j) exact += weight[std::size_t(j)] * in.v(0, h, j, i);
        exact /= sum;
        if (!(std::abs(out(0, h, t, i) - exact) <= bound)) {
          fail(std::string(what) + ": wrong result at head " + std::to_string(h) + ", row " +
               std::to_string(t) + ": " + std::to_string(out(0, h, t, i)) + " vs " +
               std::to_string(exact));
        }
      }
    }
  }
}

void report_attention(benchmark::State& state, index_t tokens, int threads, double scratch_bytes,
                      const char* what) {
  set_tokens(state, tokens);
  set_flops(state,
            double(causal_attention_flops(1, attention_heads, tokens, tokens, attention_head_dim)));
  state.counters["bytes_allocated"] = scratch_bytes;
  state.SetLabel(context_label(threads) + ", " + what);
}

/// causal_attention's scratch per thread: a score tile, an accumulator, a running max and sum.
constexpr double online_scratch_bytes =
    double(detail::attention_query_block * detail::attention_key_block +
           detail::attention_query_block * attention_head_dim + 2 * detail::attention_query_block) *
    sizeof(float);

/// One [T, T] score buffer per thread for the baseline.
std::vector<RowMatrix<float>> score_buffers(index_t tokens, int threads) {
  return std::vector<RowMatrix<float>>(std::size_t(threads), RowMatrix<float>(tokens, tokens));
}

/// Both kernels checked once per T, before either is timed: each against double precision, and
/// the two against each other on every value (they must agree to float rounding).
void verify_attention_once(const AttentionInputs& in) {
  static std::set<index_t> verified;
  const index_t tokens = in.q.dim(2);
  if (!verified.insert(tokens).second) return;
  const auto online = causal_attention(in.q, in.k, in.v);
  verify_attention("attention/dissect", in, online);
  auto scores = score_buffers(tokens, 1);
  auto out = Tensor<float, 4>::uninitialized(in.q.shape());
  use_threads(1);  // one buffer
  materialised_attention(in, out, scores);
  verify_attention("attention/baseline_materialised", in, out);
  const double bound = 4.0 * double(tokens + attention_head_dim) * 0x1.0p-24;
  for (index_t i = 0; i < out.size(); ++i) {
    if (!(std::abs(out.data()[i] - online.data()[i]) <= bound)) {
      fail("attention: the materialised baseline and causal_attention differ at flat index " +
           std::to_string(i) + ": " + std::to_string(out.data()[i]) + " vs " +
           std::to_string(online.data()[i]));
    }
  }
}

void attention_dissect(benchmark::State& state, index_t tokens, int threads) {
  const AttentionInputs in(tokens);
  verify_attention_once(in);
  use_threads(threads);
  for (auto _ : state) {
    auto out = causal_attention(in.q, in.k, in.v);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  report_attention(state, tokens, threads, online_scratch_bytes,
                   "causal_attention (online softmax); bytes_allocated = scratch per thread");
}

void attention_materialised(benchmark::State& state, index_t tokens, int threads) {
  const AttentionInputs in(tokens);
  verify_attention_once(in);
  use_threads(threads);
  // One [T, T] buffer per thread, allocated before timing: the baseline's most favourable case
  // (allocating 4·T² bytes per call would add page faults to every call).
  auto scores = score_buffers(tokens, threads);
  for (auto _ : state) {
    auto out = Tensor<float, 4>::uninitialized(in.q.shape());
    materialised_attention(in, out, scores);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  report_attention(state, tokens, threads, double(tokens) * double(tokens) * sizeof(float),
                   "naive Eigen, [T, T] scores per head; bytes_allocated = scores per thread");
}

// ---- registration -------------------------------------------------------------------------------

void register_all() {
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  const auto add = [](const std::string& name, auto function, auto... args) {
    benchmark::RegisterBenchmark(name.c_str(), function, args...)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  const auto suffix = [](const char* key, index_t value, int threads) {
    return std::string(key) + "=" + std::to_string(value) + "/threads=" + std::to_string(threads);
  };
  const char* gpt2 = "GPT2Model gpt2-small (L=12, D=768, V=50257)";
  const char* gpt2_packed = "GPT2Model gpt2-small, pack()ed: packed GEMM, fused epilogues";
  const char* llama =
      "LlamaModel at llama-7b shapes with n_layers=1, vocab=256 (one layer + embedding, norm, "
      "head)";
  for (int threads : thread_counts) {
    for (index_t tokens : {128, 512}) {
      add("prefill/gpt2-small/" + suffix("T", tokens, threads), prefill<GPT2Model<float>>,
          &gpt2_model, ModelCase{"gpt2-small", gpt2, tokens, threads});
    }
    for (index_t context : {128, 1023}) {
      add("decode/gpt2-small/" + suffix("context", context, threads), decode<GPT2Model<float>>,
          &gpt2_model, ModelCase{"gpt2-small", gpt2, context, threads});
    }
    for (index_t tokens : {128, 512}) {
      add("prefill/gpt2-small-packed/" + suffix("T", tokens, threads), prefill<GPT2Model<float>>,
          &gpt2_packed_model, ModelCase{"gpt2-small-packed", gpt2_packed, tokens, threads});
    }
    for (index_t context : {128, 1023}) {
      add("decode/gpt2-small-packed/" + suffix("context", context, threads),
          decode<GPT2Model<float>>, &gpt2_packed_model,
          ModelCase{"gpt2-small-packed", gpt2_packed, context, threads});
    }
    for (index_t tokens : {128, 512}) {
      add("prefill/llama-7b-layer/" + suffix("T", tokens, threads), prefill<LlamaModel<float>>,
          &llama_layer_model, ModelCase{"llama-7b-layer", llama, tokens, threads});
    }
    for (index_t context : {128, 1024}) {
      add("decode/llama-7b-layer/" + suffix("context", context, threads), decode<LlamaModel<float>>,
          &llama_layer_model, ModelCase{"llama-7b-layer", llama, context, threads});
    }
    for (index_t tokens : {512, 2048, 4096}) {
      add("attention/dissect/" + suffix("T", tokens, threads), attention_dissect, tokens, threads);
      add("attention/baseline_materialised/" + suffix("T", tokens, threads), attention_materialised,
          tokens, threads);
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
