// examples/common/data_parallel_run.hpp — train_gpt under `mpiexec -n N`: data-parallel training
// with dissect::parallel::DataParallel, each rank on its B/N windows of every global batch.
//
// NOT part of the dissect library: example-only. Built with MPI when the dissect::parallel target
// exists (DISSECT_EXAMPLES_MPI); without it, or when the program is not started by mpiexec with
// more than one process, every function here is a no-op and training is the one-process loop.
//
// Every rank reads the same data, builds the same model from the same seed and draws the same
// global batches (the generators are seeded alike); only rank 0 prints and writes files (the
// others' stdout and stderr go to /dev/null). An error during setup is the same on every rank
// (the same flags, files and seed), and one during a step reaches every rank through
// DataParallel's agreement, so all ranks stop with it and rank 0 prints it; the one rank-local
// phase, rank 0 opening its output files, ends the job with MPI_Abort if it fails, so no rank is
// left waiting in a collective.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/char_lm.hpp"
#include "common/cli.hpp"
#include "dissect/layers/embedding.hpp"
#include "dissect/training/optim.hpp"

#ifdef DISSECT_EXAMPLES_MPI
#include <mpi.h>

#include "dissect/parallel/data_parallel.hpp"
#endif

namespace dissect::examples {

// ---- declarations -------------------------------------------------------------------------------

/// The processes of this run: MPI is initialised only when a launcher (Open MPI's mpiexec, or
/// MPICH's Hydra) started more than one, so a plain run never touches MPI.
class MpiRun {
 public:
  /// Call once, first thing in main. Silences ranks > 0 (stdout and stderr to /dev/null).
  static MpiRun& start(int& argc, char**& argv);
  /// The run start() made (one process if it was not called).
  static MpiRun& get();
  ~MpiRun();

  bool parallel() const { return size_ > 1; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Ranks > 0 write no file: each PATH flag becomes "none".
  void no_files_on_other_ranks(std::initializer_list<std::string*> paths) const;
  /// --batch must split evenly over the ranks. @throws UsageError naming --batch.
  void check_batch(index_t batch) const;
  /// Runs `open` (rank-local work: rank 0 opening its output files); if it throws while other
  /// ranks wait, prints "<program>: <error>" and ends the job (MPI_Abort, status 2).
  template <class Open>
  auto on_this_rank(const char* program, Open&& open);

#ifdef DISSECT_EXAMPLES_MPI
  const parallel::Communicator& communicator() const {
    return *communicator_;
  }
#endif

 private:
  MpiRun() = default;
  int rank_ = 0, size_ = 1;
#ifdef DISSECT_EXAMPLES_MPI
  std::optional<parallel::Communicator> communicator_;
#endif
};

/// train_model (char_lm.hpp), data-parallel when the run has more than one rank: the model's
/// loss_and_backward then runs this rank's rows of each global batch and returns the mean loss
/// over all ranks' rows, with the gradients averaged; the optimizer's step is followed by the
/// ZeRO gather. One process: train_model itself.
template <class Scalar>
class DataParallelTraining {
 public:
  /// Collective when parallel: `groups` are the optimizer's parameter groups (all trainable
  /// parameters between them). `shard_optimizer`: ZeRO stage 1.
  DataParallelTraining(const MpiRun& run,
                       std::initializer_list<std::vector<ParameterRef<Scalar>>*> groups,
                       bool shard_optimizer);
  /// Replaces each group by what its optimizer must update (its shard, with ZeRO).
  void to_optimizer_parameters(std::initializer_list<std::vector<ParameterRef<Scalar>>*> groups);

  template <class Model, class Optimizer, class StepHook>
  TrainTime train(Model& model, Optimizer& optimizer, const TrainLoop& loop,
                  std::span<const index_t> train, Generator& generator,
                  std::span<const Batch> valid, Curves& curves, StepHook&& on_step);

  /// One line on the reduction's cost ("" for one process).
  std::string report(double training_seconds) const;

 private:
#ifdef DISSECT_EXAMPLES_MPI
  std::optional<parallel::DataParallel<Scalar>> dp_;
#endif
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// The process count a launcher announced in the environment, 1 if none.
inline int launched_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  }
  return 1;
}

inline MpiRun*& current_run() {
  static MpiRun* run = nullptr;
  return run;
}

}  // namespace detail

inline MpiRun& MpiRun::start([[maybe_unused]] int& argc, [[maybe_unused]] char**& argv) {
  static MpiRun run;
  detail::current_run() = &run;
#ifdef DISSECT_EXAMPLES_MPI
  if (detail::launched_processes() > 1) {
    MPI_Init(&argc, &argv);
    run.communicator_.emplace(MPI_COMM_WORLD);
    run.rank_ = run.communicator_->rank();
    run.size_ = run.communicator_->size();
    if (run.rank_ > 0) {
      // Rank 0 speaks for all: the others' lines would repeat its own.
      if (!std::freopen("/dev/null", "w", stdout) || !std::freopen("/dev/null", "w", stderr)) {
        MPI_Abort(MPI_COMM_WORLD, kExitFailure);
      }
    }
  }
#endif
  return run;
}

inline MpiRun& MpiRun::get() {
  if (detail::current_run() == nullptr) {
    int argc = 0;
    char** argv = nullptr;
    return start(argc, argv);
  }
  return *detail::current_run();
}

inline MpiRun::~MpiRun() {
#ifdef DISSECT_EXAMPLES_MPI
  if (communicator_) {
    communicator_.reset();  // frees its duplicate while MPI is alive
    MPI_Finalize();
  }
#endif
}

inline void MpiRun::no_files_on_other_ranks(std::initializer_list<std::string*> paths) const {
  if (rank_ == 0) return;
  for (std::string* path : paths) *path = "none";
}

inline void MpiRun::check_batch(index_t batch) const {
  if (batch % size_ != 0) {
    throw UsageError("--batch: " + std::to_string(batch) + " is not divisible by the " +
                     std::to_string(size_) +
                     " processes of mpiexec (each trains on B/N windows of every batch)");
  }
}

template <class Open>
auto MpiRun::on_this_rank(const char* program, Open&& open) {
  if (!parallel()) return open();
  try {
    return open();
  } catch (const std::exception& error) {
    std::cerr << program << ": " << error.what() << "\n";
    std::cerr.flush();
#ifdef DISSECT_EXAMPLES_MPI
    MPI_Abort(MPI_COMM_WORLD, kExitBadInput);  // the other ranks wait in the first collective
#endif
    throw;
  }
}

#ifdef DISSECT_EXAMPLES_MPI

/// The model as train_model sees it under data parallelism: forward and evaluation are the
/// whole model's (every rank holds it), loss_and_backward this rank's rows.
template <class Model, class Scalar>
class DataParallelModel {
 public:
  using Cache = typename Model::Cache;
  DataParallelModel(Model& model, parallel::DataParallel<Scalar>& dp) : model_(model), dp_(dp) {}
  const auto& config() const { return model_.config(); }
  auto forward(TokenBatch tokens) const { return model_.forward(tokens); }
  void zero_grad() { model_.zero_grad(); }
  Scalar loss_and_backward(TokenBatch inputs, std::span<const index_t> targets, Cache& cache) {
    const auto rows = dp_.local_rows(inputs.batch);
    const auto T = static_cast<std::size_t>(inputs.seq);
    const auto first = static_cast<std::size_t>(rows.begin) * T;
    const auto count = static_cast<std::size_t>(rows.size()) * T;
    const TokenBatch mine{inputs.ids.subspan(first, count), rows.size(), inputs.seq};
    return static_cast<Scalar>(dp_.compute_gradients(
        [&] { return model_.loss_and_backward(mine, targets.subspan(first, count), cache); }));
  }

 private:
  Model& model_;
  parallel::DataParallel<Scalar>& dp_;
};

/// The optimizer under data parallelism: its step, then the ZeRO gather of the updated shards.
template <class Optimizer, class Scalar>
struct DataParallelOptimizer {
  Optimizer& optimizer;
  parallel::DataParallel<Scalar>& dp;
  void set_lr(double lr) { optimizer.set_lr(lr); }
  void step() {
    optimizer.step();
    dp.synchronize_parameters();
  }
};

#endif

template <class Scalar>
DataParallelTraining<Scalar>::DataParallelTraining(
    [[maybe_unused]] const MpiRun& run,
    [[maybe_unused]] std::initializer_list<std::vector<ParameterRef<Scalar>>*> groups,
    [[maybe_unused]] bool shard_optimizer) {
#ifdef DISSECT_EXAMPLES_MPI
  if (!run.parallel()) return;
  std::vector<ParameterRef<Scalar>> all;
  for (const auto* group : groups) all.insert(all.end(), group->begin(), group->end());
  dp_.emplace(run.communicator(), std::move(all),
              parallel::DataParallelOptions{.shard_optimizer = shard_optimizer});
#endif
}

template <class Scalar>
void DataParallelTraining<Scalar>::to_optimizer_parameters(
    [[maybe_unused]] std::initializer_list<std::vector<ParameterRef<Scalar>>*> groups) {
#ifdef DISSECT_EXAMPLES_MPI
  if (!dp_) return;
  for (auto* group : groups) *group = dp_->optimizer_parameters(*group);
#endif
}

template <class Scalar>
template <class Model, class Optimizer, class StepHook>
TrainTime DataParallelTraining<Scalar>::train(Model& model, Optimizer& optimizer,
                                              const TrainLoop& loop, std::span<const index_t> train,
                                              Generator& generator, std::span<const Batch> valid,
                                              Curves& curves, StepHook&& on_step) {
#ifdef DISSECT_EXAMPLES_MPI
  if (dp_) {
    DataParallelModel<Model, Scalar> parallel_model(model, *dp_);
    DataParallelOptimizer<Optimizer, Scalar> parallel_optimizer{optimizer, *dp_};
    dp_->reset_stats();
    return train_model(parallel_model, parallel_optimizer, loop, train, generator, valid, curves,
                       std::forward<StepHook>(on_step));
  }
#endif
  return train_model(model, optimizer, loop, train, generator, valid, curves,
                     std::forward<StepHook>(on_step));
}

template <class Scalar>
std::string DataParallelTraining<Scalar>::report([[maybe_unused]] double training_seconds) const {
#ifdef DISSECT_EXAMPLES_MPI
  if (!dp_) return "";
  const auto& s = dp_->stats();
  const double megabytes =
      static_cast<double>(dp_->parameter_count()) * static_cast<double>(sizeof(Scalar)) / 1e6;
  char gathers[96] = "";
  if (dp_->options().shard_optimizer) {
    std::snprintf(gathers, sizeof gathers, ", ZeRO-1 parameter gathers %.2f s", s.gather_seconds);
  }
  char line[320];
  std::snprintf(line, sizeof line,
                "data-parallel over %d ranks: %lld gradient reductions of %.1f MB in %.2f s "
                "(%.1f %% of training)%s, agreements and losses %.2f s\n",
                dp_->ranks(), static_cast<long long>(s.reductions), megabytes, s.reduce_seconds,
                100.0 * s.reduce_seconds / std::max(training_seconds, 1e-9), gathers,
                s.agreement_seconds);
  return line;
#else
  return "";
#endif
}

}  // namespace dissect::examples
