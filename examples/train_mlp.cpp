// train_mlp — trains a multilayer perceptron of dissect::Linear layers and ReLUs on Fashion-MNIST.
//
//   train_mlp                  # 784-256-128-10, Adam lr 1e-3, batch 128, 10 epochs
//   train_mlp --optimizer sgd --lr 0.05 --momentum 0.9 --epochs 20 --hidden 512,256
//   train_mlp --epochs 1 --train-limit 2000 --test-limit 500   # well under a second
//
// The data come from the Debian package dataset-fashion-mnist. Every epoch prints the mean
// training loss, training and test accuracy, and the throughput; at the end the loss and
// accuracy curves go to train_mlp.svg. examples/train_mlp_torch.py trains the identical model in
// PyTorch — same initial weights, same batch order — so the two runs can be laid side by side.
//
// The training step allocates nothing: every activation and gradient buffer is made once per
// batch size before the first epoch, and the layers write into them with forward_into and
// backward_into.
//
// Every flag is checked before any work — ranges, names, the model's memory, and that the --svg
// path can be written — and the data files as they are read. Exit status: 0 success, 2 bad
// input (a flag, the output path, a missing or corrupt data file), 1 anything else.
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/cli.hpp"
#include "common/fashion_mnist.hpp"
#include "common/svg_plot.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/sequential.hpp"
#include "dissect/tensor/tensor.hpp"
#include "dissect/training/loss.hpp"
#include "dissect/training/optim.hpp"

namespace {

using dissect::index_t;
using dissect::Linear;
using dissect::Tensor;
using Clock = std::chrono::steady_clock;

// ---- flags --------------------------------------------------------------------------------------

using dissect::examples::check_range;
using dissect::examples::check_real;
using dissect::examples::FlagDeclarer;
using dissect::examples::UsageError;

// Limits that keep a typo from asking for days of work or more memory than a desktop has: 1000
// epochs of the default model take minutes to half an hour, and it needs 25 MB of the 4 GiB.
constexpr index_t kMaxEpochs = 1000;
constexpr index_t kMaxBatch = 65536;
constexpr index_t kMaxModelBytes = index_t{1} << 32;
constexpr int kMaxThreads = 1024;
// The per-batch loss curve keeps at most this many points an epoch (means of consecutive
// batches), so that its memory and the figure stay small however small the batch.
constexpr index_t kCurvePointsPerEpoch = 1000;
// Evaluation runs in batches of this many images.
constexpr index_t kEvalBatch = 1000;

struct Flags {
  std::string hidden_text = "256,128";
  std::vector<index_t> hidden;  // hidden_text, parsed by validate()
  std::string init = "pytorch";
  std::string optimizer = "adam";
  std::optional<double> lr;
  double momentum = 0.9;
  bool nesterov = false;
  std::optional<double> weight_decay;
  index_t epochs = 10;
  index_t batch = 128;
  std::uint64_t seed = 0;
  std::string data = dissect::examples::fashion_mnist_default_dir;
  index_t train_limit = -1;
  index_t test_limit = -1;
  bool no_normalize = false;
  int threads = 0;  // 0: leave Eigen's default
  std::string svg = "train_mlp.svg";
};

/// The layer widths: 784 Fashion-MNIST pixels (the reader accepts no other image size), the
/// hidden widths, 10 classes.
std::vector<index_t> model_widths(const Flags& flags) {
  std::vector<index_t> widths{dissect::examples::fashion_mnist_rows *
                              dissect::examples::fashion_mnist_cols};
  widths.insert(widths.end(), flags.hidden.begin(), flags.hidden.end());
  widths.push_back(static_cast<index_t>(dissect::examples::fashion_mnist_classes.size()));
  return widths;
}

/// Declares every flag on `app`, parsed into `flags`; validate() then checks them.
void add_flags(CLI::App& app, Flags& flags) {
  FlagDeclarer option(app);

  option.group("Model and optimisation");
  option("--hidden", flags.hidden_text, "LIST",
         "hidden layer widths, comma-separated; \"\" for a linear classifier (default 256,128)");
  option("--init", flags.init, "NAME",
         "pytorch (nn.Linear's default, U(±1/√in) for W and b) or kaiming (W ~ U(±√(6/in)), "
         "b = 0) (default pytorch)");
  option("--optimizer", flags.optimizer, "NAME", "adam, adamw or sgd (default adam)");
  option("--lr", flags.lr, "X",
         "learning rate, finite and > 0 (default 1e-3 for adam/adamw, 0.05 for sgd)");
  option("--momentum", flags.momentum, "X", "SGD momentum, in [0, 1) (default 0.9)");
  app.add_flag("--nesterov", flags.nesterov, "SGD with Nesterov momentum")->group(option.group());
  option("--weight-decay", flags.weight_decay, "X",
         "Adam/SGD: L2 term added to the gradient; AdamW: decoupled (default 0; 0.01 for adamw)");
  option("--epochs", flags.epochs, "N", "passes over the training set, 1 to 1000 (default 10)");
  option("--batch", flags.batch, "N", "training batch size, 1 to 65536 (default 128)");
  option("--seed", flags.seed, "S",
         "layer i starts from dissect::Generator(S + i); the batch order comes from "
         "dissect::Generator(S + 1000) (default 0)");

  option.group("Data");
  option("--data", flags.data, "DIR",
         "directory of the gzipped IDX files (default " + flags.data + ")");
  option("--train-limit", flags.train_limit, "N",
         "use only the first N training images (default: all 60000)");
  option("--test-limit", flags.test_limit, "N",
         "use only the first N test images (default: all 10000)");
  app.add_flag("--no-normalize", flags.no_normalize,
               "feed pixels scaled to [0, 1] as they are; by default they are standardised, "
               "(x − 0.2860) / 0.3530, with the training set's mean and standard deviation (over "
               "10 epochs that gives 88.7–89.2 % test accuracy instead of 88.0–88.6 % for seeds "
               "0–3)")
      ->group(option.group());

  option.group("Output and machine");
  option("--threads", flags.threads, "N",
         "threads for Eigen's GEMM, 1 to 1024 (needs a build with -DDISSECT_USE_OPENMP=ON)");
  option("--svg", flags.svg, "PATH",
         "where the curves go, checked before training (default train_mlp.svg; \"none\" to skip)");
  app.footer(
      "Batch order: each epoch shuffles the indices 0..n−1 with Fisher–Yates, i from n−1 down "
      "to 1, j = next_u64() mod (i + 1), from one generator that runs on across epochs; the last "
      "batch of an epoch may be smaller. train_mlp_torch.py does exactly the same.\n\n" +
      std::string(dissect::examples::kExitStatusHelp));
}

std::vector<index_t> parse_widths(std::string_view flag, const std::string& list) {
  std::vector<index_t> widths;
  for (std::string_view text = list; !text.empty();) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    index_t width = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), width);
    if (ec != std::errc() || end != item.data() + item.size() || width <= 0) {
      throw UsageError(std::string(flag) + ": \"" + std::string(item) +
                       "\" is not a width > 0 in the list \"" + list + "\"");
    }
    widths.push_back(width);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return widths;  // empty: no hidden layer, a linear classifier
}

/// Bytes the run will hold, counted in int64 with overflow checks: weights and gradients, the
/// optimizer's state (Adam's two moments, SGD's momentum), and the activations and their
/// gradients of the training and evaluation workspaces (a full batch and a short last one each).
index_t model_bytes(const Flags& flags) {
  const std::string what = "--hidden " + flags.hidden_text + " with --batch " +
                           std::to_string(flags.batch) + ": the model's size";
  const auto widths = model_widths(flags);
  index_t parameters = 0, activations = 0;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    activations = dissect::checked_add(activations, widths[i], what);
    if (i + 1 < widths.size()) {
      const index_t in_plus_bias = dissect::checked_add(widths[i], 1, what);  // W and b
      parameters = dissect::checked_add(
          parameters, dissect::checked_mul(in_plus_bias, widths[i + 1], what), what);
    }
  }
  const index_t copies = flags.optimizer == "sgd" ? 3 : 4;
  const index_t rows = 2 * flags.batch + 2 * kEvalBatch;
  return dissect::checked_sum({dissect::checked_product({4, copies, parameters}, what),
                               dissect::checked_product({4, 2, rows, activations}, what)},
                              what);
}

/// Everything CLI11 cannot check: names, ranges, combinations and the model's size, before any
/// work is done. @throws UsageError naming the flag.
void validate(Flags& flags) {
  flags.hidden = parse_widths("--hidden", flags.hidden_text);
  if (flags.init != "pytorch" && flags.init != "kaiming") {
    throw UsageError("--init: unknown scheme \"" + flags.init + "\" (pytorch or kaiming)");
  }
  if (flags.optimizer != "adam" && flags.optimizer != "adamw" && flags.optimizer != "sgd") {
    throw UsageError("--optimizer: unknown optimizer \"" + flags.optimizer +
                     "\" (adam, adamw or sgd)");
  }
  if (flags.lr) check_real("--lr", *flags.lr, 0, false);
  check_real("--momentum", flags.momentum, 0, true, 1);
  if (flags.weight_decay) check_real("--weight-decay", *flags.weight_decay, 0, true);
  if (flags.nesterov && (flags.optimizer != "sgd" || flags.momentum == 0)) {
    throw UsageError("--nesterov: needs --optimizer sgd and --momentum > 0");
  }
  check_range<index_t>("--epochs", flags.epochs, 1, kMaxEpochs);
  check_range<index_t>("--batch", flags.batch, 1, kMaxBatch);
  if (flags.train_limit != -1)
    check_range<index_t>("--train-limit", flags.train_limit, 1, INT64_MAX);
  if (flags.test_limit != -1) check_range<index_t>("--test-limit", flags.test_limit, 1, INT64_MAX);
  if (flags.threads != 0) check_range("--threads", flags.threads, 1, kMaxThreads);
#ifndef _OPENMP
  if (flags.threads > 1) {
    throw UsageError("--threads: this build has no OpenMP; configure with -DDISSECT_USE_OPENMP=ON");
  }
#endif
  index_t bytes = 0;
  try {
    bytes = model_bytes(flags);
  } catch (const dissect::OverflowError& error) {
    throw UsageError(error.what());
  }
  if (bytes > kMaxModelBytes) {
    throw UsageError("--hidden " + flags.hidden_text + " with --batch " +
                     std::to_string(flags.batch) + ": the model needs " +
                     dissect::format_count(bytes) +
                     " bytes (weights, gradients, optimizer state, activations), more than "
                     "train_mlp's limit of " +
                     dissect::format_count(kMaxModelBytes) + " bytes");
  }
}

// ---- the model ----------------------------------------------------------------------------------

/// One hidden layer, Linear then ReLU; the MLP is a runtime-deep Stack of them and the
/// classifier: widths[0] → … → widths.back(), named "0.0.0.weight", …, "1.weight".
using Hidden = dissect::Sequential<Linear<float>, dissect::ReLU>;
using Mlp = dissect::Sequential<dissect::Stack<Hidden>, Linear<float>>;

Mlp make_mlp(std::span<const index_t> widths, dissect::InitScheme init, std::uint64_t seed) {
  const auto layer = [&](std::size_t i) {
    return Linear<float>(widths[i], widths[i + 1],
                         dissect::LinearOptions{.bias = true, .init = init, .seed = seed + i});
  };
  dissect::Stack<Hidden> hidden;
  for (std::size_t i = 0; i + 2 < widths.size(); ++i) hidden.push_back(Hidden(layer(i), {}));
  return Mlp(std::move(hidden), layer(widths.size() - 2));
}

/// One batch size's buffers, made once: the input images, their labels, dlogits, and the
/// model's training cache (every activation and gradient, reused from step to step).
struct Batch {
  Tensor<float, 2> images;
  std::vector<std::int64_t> targets;
  Tensor<float, 2> dlogits;
  Mlp::Cache<2> cache;

  Batch(index_t batch, std::span<const index_t> widths)
      : images(dissect::Shape<2>{batch, widths.front()}),
        targets(static_cast<std::size_t>(batch)),
        dlogits(dissect::Shape<2>{batch, widths.back()}) {}
  index_t batch() const { return images.dim(0); }
};

std::unique_ptr<dissect::Optimizer<float>> make_optimizer(Mlp& model, const Flags& flags) {
  auto params = dissect::parameters_of(model);
  if (flags.optimizer == "sgd") {
    return std::make_unique<dissect::Sgd<float>>(
        std::move(params), dissect::SgdOptions{.lr = flags.lr.value_or(0.05),
                                               .momentum = flags.momentum,
                                               .weight_decay = flags.weight_decay.value_or(0),
                                               .nesterov = flags.nesterov});
  }
  if (flags.optimizer == "adamw") {
    return std::make_unique<dissect::AdamW<float>>(
        std::move(params),
        dissect::AdamWOptions{.lr = flags.lr.value_or(1e-3),
                              .weight_decay = flags.weight_decay.value_or(1e-2)});
  }
  return std::make_unique<dissect::Adam<float>>(
      std::move(params), dissect::AdamOptions{.lr = flags.lr.value_or(1e-3),
                                              .weight_decay = flags.weight_decay.value_or(0)});
}

// ---- data ---------------------------------------------------------------------------------------

/// Pixel value → network input, as a table so that the conversion is bit-identical to the
/// PyTorch script's (float(p) / 255, then (x − mean) / std unless --no-normalize, all in float;
/// 0.2860 and 0.3530 are the mean and standard deviation of the 60,000 training images).
std::array<float, 256> pixel_table(bool normalize) {
  std::array<float, 256> table{};
  for (int p = 0; p < 256; ++p) {
    float x = static_cast<float>(p) / 255.0f;
    if (normalize) x = (x - 0.2860f) / 0.3530f;
    table[static_cast<std::size_t>(p)] = x;
  }
  return table;
}

/// Rows order[first .. first + batch) of `set` into the workspace's input and targets.
void gather_batch(const dissect::examples::ImageSet& set, std::span<const index_t> order,
                  index_t first, const std::array<float, 256>& table, Batch& w) {
  const index_t pixels = set.pixels_per_image();
  for (index_t r = 0; r < w.batch(); ++r) {
    const index_t image = order[static_cast<std::size_t>(first + r)];
    const std::uint8_t* src = set.image(image);
    float* dst = w.images.data() + r * pixels;
    for (index_t k = 0; k < pixels; ++k) dst[k] = table[src[k]];
    w.targets[static_cast<std::size_t>(r)] = set.labels[static_cast<std::size_t>(image)];
  }
}

/// Fisher–Yates as documented in --help; train_mlp_torch.py implements the same steps.
void shuffle(std::vector<index_t>& order, dissect::Generator& generator) {
  for (std::size_t i = order.size(); i-- > 1;) {
    const auto j = static_cast<std::size_t>(generator.next_u64() % (i + 1));
    std::swap(order[i], order[j]);
  }
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

/// Mean loss and accuracy over the whole set, in batches of at most `full.batch()` rows.
Evaluation evaluate(const Mlp& model, const dissect::examples::ImageSet& set,
                    std::span<const index_t> order, const std::array<float, 256>& table,
                    Batch& full, Batch* tail) {
  double loss_sum = 0;
  index_t correct = 0;
  for (index_t first = 0; first < set.count; first += full.batch()) {
    Batch& w = set.count - first >= full.batch() ? full : *tail;
    gather_batch(set, order, first, table, w);
    const auto logits = model.forward(w.images, w.cache);
    loss_sum += static_cast<double>(dissect::cross_entropy(logits, w.targets)) *
                static_cast<double>(w.batch());
    correct += dissect::count_correct(logits, w.targets);
  }
  const auto count = static_cast<double>(set.count);
  return {loss_sum / count, 100.0 * static_cast<double>(correct) / count};
}

/// "81,234": thousands separated, for throughput figures.
std::string grouped(double value) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(value)));
  for (auto at = static_cast<std::ptrdiff_t>(digits.size()) - 3; at > 0; at -= 3) {
    digits.insert(static_cast<std::size_t>(at), ",");
  }
  return digits;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int threads_in_use() {
#ifdef _OPENMP
  return Eigen::nbThreads();
#else
  return 1;
#endif
}

// ---- training -----------------------------------------------------------------------------------

/// Trains and evaluates as `flags` (validated) say; the curves go to `figure` at the end.
int run(const Flags& flags, dissect::examples::OutputFile& figure) {
#ifdef _OPENMP
  if (flags.threads > 0) Eigen::setNbThreads(flags.threads);
#endif

  const auto load_start = Clock::now();
  dissect::examples::FashionMnist data;
  try {
    data = dissect::examples::load_fashion_mnist(flags.data, flags.train_limit, flags.test_limit);
  } catch (const dissect::examples::DatasetMissing& missing) {
    std::cerr << "train_mlp: " << missing.what() << "\n"
              << "Fashion-MNIST is not installed. Install it with:\n"
              << "  sudo apt-get install " << dissect::examples::fashion_mnist_package << "\n"
              << "or point --data at a directory holding the four *-idx*-ubyte[.gz] files.\n";
    return 2;
  }
  const double load_seconds = seconds_since(load_start);

  const std::vector<index_t> widths = model_widths(flags);  // the reader guarantees 784 pixels
  Mlp model = make_mlp(widths,
                       flags.init == "kaiming" ? dissect::InitScheme::kaiming_uniform
                                               : dissect::InitScheme::pytorch_default,
                       flags.seed);
  auto optimizer = make_optimizer(model, flags);

  // Every buffer the loop touches, made now: the full batch and the short last one, for
  // training and for evaluation.
  const index_t n_train = data.train.count, n_test = data.test.count;
  const index_t batch = std::min(flags.batch, n_train);
  const index_t eval_batch = std::min(kEvalBatch, n_test);
  Batch train_full(batch, widths), eval_full(eval_batch, widths);
  std::optional<Batch> train_tail, eval_tail;
  if (n_train % batch) train_tail.emplace(n_train % batch, widths);
  if (n_test % eval_batch) eval_tail.emplace(n_test % eval_batch, widths);
  std::vector<index_t> order(static_cast<std::size_t>(n_train));
  std::vector<index_t> test_order(static_cast<std::size_t>(n_test));
  for (index_t i = 0; i < n_test; ++i) test_order[static_cast<std::size_t>(i)] = i;
  const auto table = pixel_table(!flags.no_normalize);
  dissect::Generator data_order(flags.seed + 1000);

  const index_t batches_per_epoch = (n_train + batch - 1) / batch;
  // The per-batch curve's points: the mean loss of `stride` consecutive batches (1 unless an
  // epoch has more than kCurvePointsPerEpoch batches), reserved now so that the loop does not
  // allocate.
  const index_t stride = (batches_per_epoch + kCurvePointsPerEpoch - 1) / kCurvePointsPerEpoch;
  std::vector<double> batch_loss, batch_x;
  batch_loss.reserve(
      static_cast<std::size_t>((batches_per_epoch + stride - 1) / stride * flags.epochs));
  batch_x.reserve(batch_loss.capacity());
  double stride_loss = 0;
  std::vector<double> epoch_x, train_loss, test_loss, train_acc, test_acc;

  std::string model_text = std::to_string(widths.front());
  for (std::size_t i = 1; i < widths.size(); ++i) model_text += "-" + std::to_string(widths[i]);
  std::printf("train_mlp: MLP %s (ReLU), %s parameters, init %s\n", model_text.c_str(),
              grouped(static_cast<double>(model.parameter_count())).c_str(), flags.init.c_str());
  std::printf("  data: %lld train / %lld test images from %s (read in %.2f s)%s\n",
              static_cast<long long>(n_train), static_cast<long long>(n_test), flags.data.c_str(),
              load_seconds, !flags.no_normalize ? ", standardised" : ", scaled to [0, 1]");
  std::printf("  %s lr %g", flags.optimizer.c_str(), optimizer->lr());
  if (flags.optimizer == "sgd") {
    std::printf(" momentum %g%s", flags.momentum, flags.nesterov ? " (nesterov)" : "");
  }
  std::printf(" weight decay %g, batch %lld, %lld epochs, seed %llu\n",
              flags.weight_decay.value_or(flags.optimizer == "adamw" ? 1e-2 : 0.0),
              static_cast<long long>(batch), static_cast<long long>(flags.epochs),
              static_cast<unsigned long long>(flags.seed));
  std::printf("  Eigen %d.%d.%d, SIMD %s, %d thread(s)\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
              EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse(), threads_in_use());

  double total_train_seconds = 0;
  for (index_t epoch = 1; epoch <= flags.epochs; ++epoch) {
    for (index_t i = 0; i < n_train; ++i) order[static_cast<std::size_t>(i)] = i;
    shuffle(order, data_order);

    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    index_t correct = 0;
    for (index_t first = 0, step = 0; first < n_train; first += batch, ++step) {
      Batch& w = n_train - first >= batch ? train_full : *train_tail;
      gather_batch(data.train, order, first, table, w);
      optimizer->zero_grad();
      const auto logits = model.forward(w.images, w.cache);
      correct += dissect::count_correct(logits, w.targets);
      const float loss = dissect::cross_entropy_forward_backward(logits, w.targets, w.dlogits);
      // The images need no gradient (PyTorch knows this from requires_grad=False): skipping
      // dx = dy·W of the first layer saves as much work as the widest forward product.
      model.backward_parameters(w.images, w.cache, w.dlogits);
      optimizer->step();
      loss_sum += static_cast<double>(loss) * static_cast<double>(w.batch());
      stride_loss += loss;
      if ((step + 1) % stride == 0 || step + 1 == batches_per_epoch) {
        batch_loss.push_back(stride_loss / static_cast<double>(step % stride + 1));
        batch_x.push_back(static_cast<double>(epoch - 1) +
                          static_cast<double>(step + 1) / static_cast<double>(batches_per_epoch));
        stride_loss = 0;
      }
    }
    const double train_seconds = seconds_since(epoch_start);
    total_train_seconds += train_seconds;

    const auto eval_start = Clock::now();
    const Evaluation test =
        evaluate(model, data.test, test_order, table, eval_full, eval_tail ? &*eval_tail : nullptr);
    const double eval_seconds = seconds_since(eval_start);

    epoch_x.push_back(static_cast<double>(epoch));
    train_loss.push_back(loss_sum / static_cast<double>(n_train));
    train_acc.push_back(100.0 * static_cast<double>(correct) / static_cast<double>(n_train));
    test_loss.push_back(test.loss);
    test_acc.push_back(test.accuracy);
    std::printf(
        "epoch %3lld/%lld  loss %.4f  train acc %6.2f%%  test loss %.4f  test acc %6.2f%%  "
        "train %6.2f s  eval %5.2f s  %s samples/s\n",
        static_cast<long long>(epoch), static_cast<long long>(flags.epochs), train_loss.back(),
        train_acc.back(), test.loss, test.accuracy, train_seconds, eval_seconds,
        grouped(static_cast<double>(n_train) / train_seconds).c_str());
    std::fflush(stdout);
  }
  std::printf("final test accuracy %.2f%% after %lld epochs; training took %.2f s (%s samples/s)\n",
              test_acc.back(), static_cast<long long>(flags.epochs), total_train_seconds,
              grouped(static_cast<double>(n_train * flags.epochs) / total_train_seconds).c_str());

  if (figure.enabled()) {
    namespace ex = dissect::examples;
    const std::vector<ex::Panel> panels = {
        {.title = "cross-entropy loss",
         .xlabel = "epoch",
         .ylabel = "loss",
         .series = {ex::line(batch_x, batch_loss,
                             {.label = "train (per batch)", .color = "#aec7e8", .width = 1}),
                    ex::line(epoch_x, train_loss,
                             {.label = "train (epoch mean)", .color = "#1f77b4"}),
                    ex::line(epoch_x, test_loss, {.label = "test", .color = "#ff7f0e"})}},
        {.title = "accuracy",
         .xlabel = "epoch",
         .ylabel = "accuracy (%)",
         .series = {ex::line(epoch_x, train_acc, {.label = "train", .color = "#1f77b4"}),
                    ex::line(epoch_x, test_acc, {.label = "test", .color = "#ff7f0e"})},
         .legend_left = true}};
    figure.write(ex::svg(panels, 1000, 420,
                         "train_mlp: MLP " + model_text + " on Fashion-MNIST, " + flags.optimizer));
    std::cout << "wrote " << figure.path() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ex = dissect::examples;
  CLI::App app("train_mlp — train an MLP of dissect::Linear layers and ReLUs on Fashion-MNIST",
               "train_mlp");
  Flags flags;
  add_flags(app, flags);
  if (const auto status = ex::parse_command_line(app, argc, argv)) return *status;
  // A corrupt data file and a configuration the library refuses are bad input too (status 2).
  return ex::run_program<ex::DatasetError, dissect::Error>("train_mlp", [&] {
    validate(flags);
    ex::OutputFile figure("--svg", flags.svg);  // a bad path fails now, not after training
    return run(flags, figure);
  });
}
