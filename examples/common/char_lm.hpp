// examples/common/char_lm.hpp — training a byte-level language model, as train_gpt and
// lora_finetune both do: batches of windows of a token split, the warm-up + cosine learning rate,
// the training loop with its report lines, the mean validation loss, and the curves a run leaves.
//
// NOT part of the dissect library: example-only. The byte vocabulary itself (and the checkpoint
// metadata that records it) is tools/common/byte_vocab.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>  // isatty

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/embedding.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/tensor.hpp"
#include "dissect/training/loss.hpp"

namespace dissect::examples {

// ---- declarations -------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

/// One batch: B·T input ids and the B·T targets (each input's next token), row-major.
struct Batch {
  std::vector<index_t> inputs, targets;
  Batch(index_t batch, index_t context)
      : inputs(static_cast<std::size_t>(batch * context)),
        targets(static_cast<std::size_t>(batch * context)) {}
};

/// Fills `out` with windows of `split` at offsets next_u64() mod (n − T − 1), b = 0 … B − 1.
void sample_batch(std::span<const index_t> split, index_t context, Generator& generator,
                  Batch& out);

/// The mean cross-entropy of the model over `batches` (an inference forward each).
template <class Model>
double evaluate(const Model& model, std::span<const Batch> batches, index_t batch, index_t context);

/// About the bytes training `config` holds on batches of B windows of config.context tokens, in
/// int64 with overflow checks: weights, gradients and Adam's two moments; each layer's training
/// cache (about 10·D + 3·F values a token and the attention probabilities, H·T a token) and its
/// gradients; the logits. @throws OverflowError naming `what`.
index_t training_bytes(const TransformerConfig& config, index_t batch, std::string_view what);

/// The default warm-up: min(100, steps / 10).
index_t default_warmup(index_t steps);

/// The learning rate of step `step` (0-based) of `steps`: linear to `peak` over `warmup` steps,
/// peak·(step + 1)/warmup, then a cosine down to peak/10 at the last step:
/// peak/10 + (peak − peak/10)·(1 + cos(π·p))/2 with p = (step − warmup + 1)/(steps − warmup).
double learning_rate(double peak, index_t warmup, index_t steps, index_t step);

/// The curves of a run: one entry per step, and the evaluations (step 0 first).
struct Curves {
  std::vector<double> step, lr, train;  ///< steps 1 … S
  std::vector<double> val_step, val;    ///< the evaluations, step 0 first
};

/// The mean training loss over each report interval (steps from + 1 … to), placed at the
/// interval's middle: the per-step loss is noisy. Returns {steps, means}.
std::pair<std::vector<double>, std::vector<double>> interval_means(const Curves& curves);

/// What a training loop runs: `steps` optimizer steps of B windows of T tokens, an evaluation
/// every `eval_every` steps and at the end.
struct TrainLoop {
  index_t steps, eval_every, batch, context;
  double lr;                     ///< the peak of learning_rate()
  index_t warmup;                ///< learning_rate()'s
  const char* lr_flag = "--lr";  ///< named when the loss diverges
  /// Steps already done (a resumed run, whose curves hold them): the loop starts after them.
  index_t first_step = 0;
  /// The step to stop after (0: `steps`): a run stopped early, to be resumed, keeps the schedule
  /// of all `steps`.
  index_t stop_after = 0;
};

/// Seconds a training loop took: all of it, and the steps alone (evaluation excluded).
struct TrainTime {
  double total = 0, training = 0;
};

/// The default step hook of train_model: nothing.
struct NoStepHook {
  template <class Cache>
  void operator()(const Cache&, bool) const {}
};

/// Runs `loop` on `model` with `optimizer` (anything with set_lr(double) and step()): before
/// step s, sample_batch from `train` with `generator` and set learning_rate(s); zero_grad,
/// loss_and_backward, step. After each report, the evaluation over `valid` is appended to
/// `curves` (whose step-0 evaluation the caller has made) and a print_progress line printed; on
/// a terminal the line is redrawn between reports too, at most ten times a second. After every
/// step (and its report line, if any) on_step(cache, report) sees the training forward's cache:
/// what a caller records about training beyond the loss (a mixture's routing, say), outside the
/// timed step. A resumed run starts at loop.first_step with `curves` as the stopped run left
/// them, and continues bit for bit if `generator`, `optimizer` and the model are restored too.
/// @throws std::runtime_error naming the step when the loss is not finite.
template <class Model, class Optimizer, class StepHook = NoStepHook>
TrainTime train_model(Model& model, Optimizer& optimizer, const TrainLoop& loop,
                      std::span<const index_t> train, Generator& generator,
                      std::span<const Batch> valid, Curves& curves, StepHook&& on_step = {});

/// A report line: "step     10/30  loss 3.1234  val 3.0123  lr 3.00e-03  9,876 tok/s  ETA 4s";
/// `val` < 0 when there is none (a redraw between reports). On a terminal the line is drawn
/// over the previous one.
void print_progress(bool tty, bool final_line, index_t step, index_t steps, double loss, double val,
                    double lr, double tokens_per_second, double eta_seconds);

double seconds_since(Clock::time_point start);
/// "42s", "3m07s", "1h05m".
std::string format_duration(double seconds);
/// A value rounded to a whole number, with thousands separators: "12,345".
std::string grouped(double value);

// ---- implementation -----------------------------------------------------------------------------

inline void sample_batch(std::span<const index_t> split, index_t context, Generator& generator,
                         Batch& out) {
  const std::uint64_t range = split.size() - static_cast<std::uint64_t>(context) - 1;
  const auto T = static_cast<std::size_t>(context);
  for (std::size_t row = 0; row * T < out.inputs.size(); ++row) {
    const auto offset = static_cast<std::size_t>(generator.next_u64() % range);
    std::copy_n(split.begin() + static_cast<std::ptrdiff_t>(offset), T,
                out.inputs.begin() + static_cast<std::ptrdiff_t>(row * T));
    std::copy_n(split.begin() + static_cast<std::ptrdiff_t>(offset + 1), T,
                out.targets.begin() + static_cast<std::ptrdiff_t>(row * T));
  }
}

template <class Model>
double evaluate(const Model& model, std::span<const Batch> batches, index_t batch,
                index_t context) {
  const index_t vocab = model.config().vocab;
  double sum = 0;
  for (const Batch& b : batches) {
    const auto logits = model.forward(TokenBatch{b.inputs, batch, context});
    sum += static_cast<double>(cross_entropy(logits.cview().reshape(Shape<2>{-1, vocab}),
                                             std::span<const index_t>(b.targets)));
  }
  return sum / static_cast<double>(batches.size());
}

inline index_t training_bytes(const TransformerConfig& config, index_t batch,
                              std::string_view what) {
  const index_t parameters = count_parameters(config).total;
  const index_t D = config.d_model, F = config.d_ff, T = config.context;
  const index_t per_layer = checked_sum({checked_mul(10, D, what), checked_mul(3, F, what),
                                         checked_product({2, config.n_heads, T}, what)},
                                        what);
  const index_t per_token =
      checked_sum({checked_mul(config.n_layers, per_layer, what), checked_mul(4, D, what),
                   checked_mul(2, config.vocab, what)},
                  what);
  const index_t tokens = checked_mul(batch, T, what);
  return checked_mul(
      4, checked_add(checked_mul(4, parameters, what), checked_mul(tokens, per_token, what), what),
      what);
}

inline index_t default_warmup(index_t steps) {
  return std::min<index_t>(100, steps / 10);
}

inline double learning_rate(double peak, index_t warmup, index_t steps, index_t step) {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double low = 0.1 * peak;
  const double progress =
      static_cast<double>(step - warmup + 1) / static_cast<double>(steps - warmup);
  return low + 0.5 * (peak - low) * (1.0 + std::cos(std::numbers::pi * progress));
}

inline std::pair<std::vector<double>, std::vector<double>> interval_means(const Curves& curves) {
  std::vector<double> mean_step, mean_loss;
  for (std::size_t i = 1; i < curves.val_step.size(); ++i) {
    const auto from = static_cast<std::size_t>(curves.val_step[i - 1]);
    const auto to = static_cast<std::size_t>(curves.val_step[i]);
    double sum = 0;
    for (std::size_t k = from; k < to; ++k) sum += curves.train[k];
    mean_step.push_back(0.5 * (curves.val_step[i - 1] + 1 + curves.val_step[i]));
    mean_loss.push_back(sum / static_cast<double>(to - from));
  }
  return {std::move(mean_step), std::move(mean_loss)};
}

template <class Model, class Optimizer, class StepHook>
TrainTime train_model(Model& model, Optimizer& optimizer, const TrainLoop& loop,
                      std::span<const index_t> train, Generator& generator,
                      std::span<const Batch> valid, Curves& curves, StepHook&& on_step) {
  const index_t B = loop.batch, T = loop.context;
  Batch batch(B, T);
  typename Model::Cache cache;
  const bool tty = isatty(fileno(stdout)) == 1;
  const auto start = Clock::now();
  auto last_redraw = start;
  TrainTime time;
  double interval_seconds = 0, interval_loss = 0;
  index_t interval_steps = 0;
  // A resumed run's report interval may have begun before it: its losses are summed again, in
  // the same order, so that the report line is the uninterrupted run's.
  if (loop.first_step > 0) {
    const auto from = curves.val_step.empty() ? 0 : static_cast<index_t>(curves.val_step.back());
    for (index_t s = from; s < loop.first_step; ++s) {
      interval_loss += curves.train[static_cast<std::size_t>(s)];
      ++interval_steps;
    }
  }
  const index_t end = loop.stop_after > 0 ? loop.stop_after : loop.steps;
  for (index_t step = loop.first_step; step < end; ++step) {
    const auto step_start = Clock::now();
    sample_batch(train, T, generator, batch);
    const double lr = learning_rate(loop.lr, loop.warmup, loop.steps, step);
    optimizer.set_lr(lr);
    model.zero_grad();
    const float loss =
        model.loss_and_backward(TokenBatch{batch.inputs, B, T}, batch.targets, cache);
    if (!std::isfinite(loss)) {
      if (tty) std::printf("\n");
      throw std::runtime_error("training diverged: the loss of step " + std::to_string(step + 1) +
                               " is " + std::to_string(loss) + " (try a lower " + loop.lr_flag +
                               ")");
    }
    optimizer.step();
    const double seconds = seconds_since(step_start);
    time.training += seconds;
    interval_seconds += seconds;
    interval_loss += loss;
    ++interval_steps;
    curves.step.push_back(static_cast<double>(step + 1));
    curves.lr.push_back(lr);
    curves.train.push_back(loss);

    const index_t done = step + 1;
    const bool report = done % loop.eval_every == 0 || done == loop.steps;
    const double tokens_per_second =
        static_cast<double>(interval_steps * B * T) / std::max(interval_seconds, 1e-9);
    double val = -1;
    if (report) {
      val = evaluate(model, valid, B, T);
      curves.val_step.push_back(static_cast<double>(done));
      curves.val.push_back(val);
    }
    const double eta = seconds_since(start) / static_cast<double>(done - loop.first_step) *
                       static_cast<double>(loop.steps - done);
    // A terminal's line is redrawn at most ten times a second: tiny models take microseconds a
    // step.
    const bool redraw = tty && seconds_since(last_redraw) >= 0.1;
    if (redraw) last_redraw = Clock::now();
    if (report || redraw) {
      print_progress(tty, report, done, loop.steps,
                     interval_loss / static_cast<double>(interval_steps), val, lr,
                     tokens_per_second, eta);
    }
    on_step(std::as_const(cache), report);
    if (report) interval_loss = 0, interval_steps = 0, interval_seconds = 0;
  }
  time.total = seconds_since(start);
  return time;
}

inline void print_progress(bool tty, bool final_line, index_t step, index_t steps, double loss,
                           double val, double lr, double tokens_per_second, double eta_seconds) {
  char line[256];
  int used = std::snprintf(line, sizeof line, "step %6lld/%lld  loss %.4f",
                           static_cast<long long>(step), static_cast<long long>(steps), loss);
  if (val >= 0) used += std::snprintf(line + used, sizeof line - used, "  val %.4f", val);
  std::snprintf(line + used, sizeof line - static_cast<std::size_t>(used),
                "  lr %.2e  %s tok/s  ETA %s", lr, grouped(tokens_per_second).c_str(),
                format_duration(eta_seconds).c_str());
  // On a terminal "\r" returns to the line's start and the padding wipes a longer old line.
  if (tty) std::printf("\r%-90s", line);
  if (!tty) std::printf("%s", line);
  if (final_line) std::printf("\n");
  std::fflush(stdout);
}

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(seconds, 0.0)));
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%llds", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s / 60 % 60);
  }
  return text;
}

inline std::string grouped(double value) {
  return format_count(static_cast<index_t>(std::llround(value)));
}

}  // namespace dissect::examples
