// dissect/parallel/data_parallel.hpp — data-parallel training over MPI: every rank holds the whole
// model, takes its slice of the global batch, and the gradients are averaged across ranks in one
// fixed order, so that every rank makes the same update.
//
// The reduction does not trust MPI_Allreduce's order (which depends on the algorithm MPI picks):
// the parameters' gradients are flattened into one bucket (allocated once), each rank owns a
// shard of it, receives that shard from every rank (MPI_Alltoall) and sums it in rank order
// 0, 1, …, n − 1, then the summed shards are gathered (MPI_Allgather). The result is bitwise the
// same on every rank and bitwise what one process gets by accumulating the n slices' gradients
// one after the other and scaling by 1/n (gradients.hpp's scale_grad). Optionally (ZeRO stage 1)
// each rank keeps the optimizer's state for its shard only, updates it, and the updated values
// are gathered instead of the gradients.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/training/optim.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// Rows [begin, end) of a global batch.
struct RowRange {
  index_t begin = 0;
  index_t end = 0;
  index_t size() const { return end - begin; }
};

/// Rank r's rows of a global batch of B split over n ranks: [r·B/n, (r+1)·B/n).
/// @throws ConfigError if B < 0, n < 1, r outside [0, n) or n does not divide B (slices of
///         unequal size would weight the ranks' mean losses unequally).
RowRange batch_rows(index_t global_batch, int rank, int ranks);

struct DataParallelOptions {
  /// ZeRO stage 1: each rank keeps optimizer state for, and updates, only its shard of the
  /// flattened parameters (build the optimizer over optimizer_parameters()); the updated values
  /// are then gathered by synchronize_parameters(). The same values as without, bit for bit.
  bool shard_optimizer = false;
};

/// What a DataParallel's collectives have cost since construction or reset_stats() (wall time
/// inside MPI, waiting for slower ranks included; payload bytes per rank).
struct DataParallelStats {
  std::int64_t reductions = 0;   ///< reduce_gradients calls
  std::int64_t gathers = 0;      ///< synchronize_parameters calls that communicated (ZeRO)
  std::int64_t bytes = 0;        ///< the buckets' bytes sent through MPI
  double reduce_seconds = 0;     ///< in the all-to-all, the ordered sum and the all-gather
  double gather_seconds = 0;     ///< in ZeRO's all-gather of the updated values
  double agreement_seconds = 0;  ///< agreement + loss gather (local work excluded)
};

/// Data parallelism over the ranks of `comm` for one list of parameters (all trainable ones, in
/// the same order on every rank). A step:
///   model.zero_grad();
///   const double loss = dp.compute_gradients([&] {   // this rank's rows only
///     return model.loss_and_backward(my_rows, my_targets, cache); });
///   optimizer.step();                // over dp.optimizer_parameters(all) (or of each group)
///   dp.synchronize_parameters();     // ZeRO: gather the updated shards; otherwise nothing
/// Not copyable: it holds views of the model's buffers (keep the model alive and in place).
template <class Scalar>
class DataParallel {
 public:
  /// Collective. Agrees across ranks on the parameters' count and sizes, on the options, and on
  /// a checksum of the parameters' values (replicas must start alike), then allocates the
  /// buckets (2·n·⌈N/n⌉ values for N parameters' values) once.
  /// @throws ShapeError, the same on every rank, if the ranks' parameters differ in count,
  ///         size or value ("DataParallel: rank 1: the values of the parameters differ …");
  ///         OverflowError if a shard exceeds MPI's int count; CommunicationError.
  DataParallel(const Communicator& comm, std::vector<ParameterRef<Scalar>> parameters,
               DataParallelOptions options = {});
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return comm_->rank(); }
  int ranks() const { return comm_->size(); }
  const DataParallelOptions& options() const { return options_; }
  /// N: the parameters' values, flattened in the constructor's order.
  index_t parameter_count() const { return count_; }
  /// This rank's shard of the flattened values: [rank·S, min((rank+1)·S, N)), S = ⌈N/n⌉.
  RowRange shard() const;

  /// This rank's rows of a global batch: batch_rows(global_batch, rank(), ranks()).
  RowRange local_rows(index_t global_batch) const {
    return batch_rows(global_batch, rank(), ranks());
  }

  /// Runs `local` — this rank's forward and backward on its rows, which adds the gradient of
  /// its rows' mean loss into the parameters' gradients and returns that loss — inside the
  /// communicator's agreement, then reduce_gradients(). Returns the mean of the ranks' losses in
  /// rank order (the global batch's mean loss, for slices of equal size), the same double on
  /// every rank: a NaN loss on one rank is NaN on all, so every rank's divergence check fires.
  /// @throws, the same on every rank, what `local` threw on the lowest failing rank, of its kind,
  ///         as "DataParallel::compute_gradients: rank r: <text>" (the text alone if every rank
  ///         threw it); ShapeError if a rank is a step ahead or behind; CommunicationError. After
  ///         a throw the gradients hold whatever `local` added: zero_grad before the next step.
  template <class Local>
  requires std::invocable<Local&>
  double compute_gradients(Local&& local);

  /// Collective: every gradient ← (1/n)·Σ_r gradient_r, each element summed in rank order by the
  /// rank that owns its shard; bitwise the same on every rank. With shard_optimizer only this
  /// rank's shard of the gradients is written (the optimizer reads no other); the rest keep
  /// this rank's local values. No allocation.
  void reduce_gradients();

  /// What an optimizer over `group` (some of the constructor's parameters, e.g. one weight-decay
  /// group) must be built over: `group` itself, or with shard_optimizer the parts of its
  /// parameters inside this rank's shard (views into the same buffers, named "name[a:b]").
  /// @throws Error naming a parameter that is not one of the constructor's.
  std::vector<ParameterRef<Scalar>> optimizer_parameters(
      const std::vector<ParameterRef<Scalar>>& group) const;

  /// Collective after the optimizer's step: with shard_optimizer, every rank's updated shard is
  /// gathered into every rank's parameters; otherwise nothing (each rank made the same update).
  void synchronize_parameters();

  const DataParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  /// Copies the flattened range [from, to) of the values (or gradients) into `bucket` at the
  /// same offsets, or back from it.
  void pack(bool gradients, index_t from, index_t to, Scalar* bucket) const;
  void unpack(bool gradients, index_t from, index_t to, const Scalar* bucket) const;

  const Communicator* comm_;
  std::vector<ParameterRef<Scalar>> parameters_;
  std::vector<index_t> offsets_;  // offsets_[i]: where parameter i starts in the flat order
  DataParallelOptions options_;
  index_t count_ = 0;                   // N
  index_t block_ = 0;                   // S = ⌈N/n⌉
  std::vector<Scalar> send_, receive_;  // n·S each
  std::vector<double> losses_;          // one per rank
  CallFacts step_facts_{.shapes = {0}, .shapes_what = "the number of steps taken"};
  std::int64_t steps_ = 0;
  DataParallelStats stats_;
};

// ---- implementation -----------------------------------------------------------------------------

inline RowRange batch_rows(index_t global_batch, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw ConfigError(dissect::detail::concat("batch_rows: rank ", rank, " of ", ranks,
                                              " ranks is not one of them"));
  }
  if (global_batch < 0 || global_batch % ranks != 0) {
    throw ConfigError(dissect::detail::concat(
        "batch_rows: the global batch of ", global_batch, " rows is not divisible by ", ranks,
        " ranks (every rank takes B/n rows; choose B a multiple of n)"));
  }
  const index_t share = global_batch / ranks;
  return {rank * share, (rank + 1) * share};
}

template <class Scalar>
DataParallel<Scalar>::DataParallel(const Communicator& comm,
                                   std::vector<ParameterRef<Scalar>> parameters,
                                   DataParallelOptions options)
    : comm_(&comm), parameters_(std::move(parameters)), options_(options) {
  static_assert(std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double>,
                "DataParallel: parameters are float or double");
  // The facts every rank must share: the options, the count and each size; and the values.
  CallFacts facts{.shapes_what = "the options and the parameters (their count, then each size)"};
  facts.shapes.reserve(parameters_.size() + 2);
  facts.shapes.push_back(options_.shard_optimizer ? 1 : 0);
  facts.shapes.push_back(static_cast<std::int64_t>(parameters_.size()));
  Checksum values;
  for (const auto& p : parameters_) {
    facts.shapes.push_back(p.size());
    values.add(std::span<const Scalar>(p.value.data(), static_cast<std::size_t>(p.size())));
  }
  facts.replicated.push_back({"the parameters", values.value()});
  const int n = comm.size();
  comm.agree("DataParallel", facts, [&] {
    offsets_.reserve(parameters_.size());
    for (const auto& p : parameters_) {
      if (p.grad.size() != p.value.size()) {
        throw ShapeError(dissect::detail::concat("DataParallel: parameter \"", p.name, "\" has ",
                                                 p.value.size(), " values but ", p.grad.size(),
                                                 " gradients"));
      }
      offsets_.push_back(count_);
      count_ = checked_add(count_, p.size(), "DataParallel: the parameter count");
    }
    block_ = count_ / n + (count_ % n != 0 ? 1 : 0);
    if (block_ > std::numeric_limits<int>::max()) {
      throw OverflowError(dissect::detail::concat(
          "DataParallel: a shard of ", block_, " values exceeds MPI's int count (",
          std::numeric_limits<int>::max(), "); use more ranks"));
    }
    // Zero padding past N: the padded tail is summed and gathered with the rest, never read.
    send_.assign(static_cast<std::size_t>(block_) * static_cast<std::size_t>(n), Scalar(0));
    receive_.assign(send_.size(), Scalar(0));
    losses_.assign(static_cast<std::size_t>(n), 0.0);
  });
}

template <class Scalar>
RowRange DataParallel<Scalar>::shard() const {
  const index_t begin = std::min(count_, block_ * rank());
  return {begin, std::min(count_, begin + block_)};
}

template <class Scalar>
void DataParallel<Scalar>::pack(bool gradients, index_t from, index_t to, Scalar* bucket) const {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const index_t begin = std::max(from, offsets_[i]);
    const index_t end = std::min(to, offsets_[i] + parameters_[i].size());
    if (begin >= end) continue;
    const Scalar* source =
        (gradients ? parameters_[i].grad.data() : parameters_[i].value.data()) - offsets_[i];
    std::copy(source + begin, source + end, bucket + begin);
  }
}

template <class Scalar>
void DataParallel<Scalar>::unpack(bool gradients, index_t from, index_t to,
                                  const Scalar* bucket) const {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const index_t begin = std::max(from, offsets_[i]);
    const index_t end = std::min(to, offsets_[i] + parameters_[i].size());
    if (begin >= end) continue;
    Scalar* target =
        (gradients ? parameters_[i].grad.data() : parameters_[i].value.data()) - offsets_[i];
    std::copy(bucket + begin, bucket + end, target + begin);
  }
}

template <class Scalar>
template <class Local>
requires std::invocable<Local&>
double DataParallel<Scalar>::compute_gradients(Local&& local) {
  // The step count is a shape fact: a rank that skipped or repeated a step is caught here, not
  // left waiting in another collective.
  step_facts_.shapes[0] = steps_;  // the member's vector: no allocation per step
  const double agreed_before = comm_->stats().agreement_seconds;
  const double loss = comm_->agree("DataParallel::compute_gradients", step_facts_,
                                   [&] { return static_cast<double>(std::invoke(local)); });
  ++steps_;
  // Every rank's loss, summed in rank order on every rank: the same double everywhere.
  const double start = MPI_Wtime();
  comm_->all_gather_into(std::span<const double>(&loss, 1), std::span<double>(losses_));
  double sum = 0;
  for (const double l : losses_) sum += l;
  // The agreement's all-reduce and the loss gather (not the local work inside the agreement).
  stats_.agreement_seconds +=
      MPI_Wtime() - start + (comm_->stats().agreement_seconds - agreed_before);
  reduce_gradients();
  return sum / static_cast<double>(ranks());
}

template <class Scalar>
void DataParallel<Scalar>::reduce_gradients() {
  const double start = MPI_Wtime();
  const int n = ranks();
  const auto S = static_cast<std::size_t>(block_);
  pack(true, 0, count_, send_.data());
  // Block p of send_ (this rank's gradients of shard p) goes to rank p; block p of receive_ is
  // rank p's gradients of this rank's shard.
  comm_->all_to_all(std::span<const Scalar>(send_), std::span<Scalar>(receive_));
  // The fixed order: rank 0's value, + rank 1's, + …, then × 1/n — what accumulating the slices
  // one after the other into zeroed gradients and scale_grad(1/n) compute, element by element.
  Scalar* mine = send_.data() + static_cast<std::size_t>(rank()) * S;
  std::copy_n(receive_.data(), S, mine);
  for (int p = 1; p < n; ++p) {
    const Scalar* theirs = receive_.data() + static_cast<std::size_t>(p) * S;
    for (std::size_t k = 0; k < S; ++k) mine[k] += theirs[k];
  }
  const auto scale = static_cast<Scalar>(1.0 / n);
  for (std::size_t k = 0; k < S; ++k) mine[k] *= scale;
  const RowRange own = shard();
  if (options_.shard_optimizer) {
    // ZeRO-1: the optimizer reads this shard's gradients only.
    unpack(true, own.begin, own.end, send_.data());
  } else {
    comm_->all_gather_into(std::span<const Scalar>(mine, S), std::span<Scalar>(send_));
    unpack(true, 0, count_, send_.data());
  }
  ++stats_.reductions;
  stats_.bytes +=
      static_cast<std::int64_t>((options_.shard_optimizer ? 1 : 2) * send_.size() * sizeof(Scalar));
  stats_.reduce_seconds += MPI_Wtime() - start;
}

template <class Scalar>
std::vector<ParameterRef<Scalar>> DataParallel<Scalar>::optimizer_parameters(
    const std::vector<ParameterRef<Scalar>>& group) const {
  std::vector<ParameterRef<Scalar>> result;
  const RowRange own = shard();
  for (const auto& ref : group) {
    // Found by its buffer: the group holds views of the same parameters, not copies.
    std::size_t i = 0;
    while (i < parameters_.size() && !(parameters_[i].value.data() == ref.value.data() &&
                                       parameters_[i].size() == ref.size())) {
      ++i;
    }
    if (i == parameters_.size()) {
      throw Error(dissect::detail::concat("DataParallel::optimizer_parameters: parameter \"",
                                          ref.name,
                                          "\" is not one of the parameters the DataParallel was "
                                          "built over"));
    }
    if (!options_.shard_optimizer) {
      result.push_back(ref);
      continue;
    }
    const index_t begin = std::max(own.begin, offsets_[i]);
    const index_t end = std::min(own.end, offsets_[i] + ref.size());
    if (begin >= end) continue;
    const index_t a = begin - offsets_[i], length = end - begin;
    result.push_back({ref.size() == length
                          ? ref.name
                          : dissect::detail::concat(ref.name, "[", a, ":", a + length, "]"),
                      TensorView<Scalar, 1>(ref.value.data() + a, Shape<1>{length}),
                      TensorView<Scalar, 1>(ref.grad.data() + a, Shape<1>{length})});
  }
  return result;
}

template <class Scalar>
void DataParallel<Scalar>::synchronize_parameters() {
  if (!options_.shard_optimizer) return;
  const double start = MPI_Wtime();
  const auto S = static_cast<std::size_t>(block_);
  const RowRange own = shard();
  Scalar* mine = send_.data() + static_cast<std::size_t>(rank()) * S;
  pack(false, own.begin, own.end, send_.data());
  comm_->all_gather_into(std::span<const Scalar>(mine, S), std::span<Scalar>(send_));
  unpack(false, 0, count_, send_.data());
  ++stats_.gathers;
  stats_.bytes += static_cast<std::int64_t>(send_.size() * sizeof(Scalar));
  stats_.gather_seconds += MPI_Wtime() - start;
}

}  // namespace dissect::parallel
