// dissect/parallel/communicator.hpp — the MPI communicator the tensor-parallel layers share.
//
// Communicator wraps a communicator the user owns (MPI_COMM_WORLD or a split of it): it never
// calls MPI_Init or MPI_Finalize and never changes the user's communicator. It duplicates it, so
// the layers' collectives cannot match the user's own messages, and sets MPI_ERRORS_RETURN on the
// duplicate only, so an MPI failure becomes a CommunicationError instead of an abort. agree()
// is how ranks find out that they disagree about a shape: every rank throws the same ShapeError,
// where a mismatched collective would hang or corrupt memory.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/error.hpp"
#include "dissect/shape.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// An MPI call that failed: the message names the call and MPI's own error text.
struct CommunicationError : Error {
  using Error::Error;
};

/// What all_reduce_sum has done since construction or reset_stats(): calls, payload bytes (per
/// rank: the buffer's size, not what the MPI algorithm sends on the wire) and wall seconds spent
/// inside MPI_Allreduce (waiting for slower ranks included). agree()'s small reductions are not
/// counted.
struct CommunicationStats {
  std::int64_t all_reduces = 0;
  std::int64_t bytes = 0;
  double seconds = 0;
};

class Communicator {
 public:
  /// Duplicates `comm` (a collective call on it). MPI must be initialised and stay so for the
  /// communicator's life. @throws CommunicationError if MPI is not initialised or the dup fails.
  explicit Communicator(MPI_Comm comm);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The duplicate the layers communicate on (errors return, never abort).
  MPI_Comm native() const { return comm_; }

  /// values ← Σ over ranks of values, in place. Every rank must pass the same length (the layers
  /// agree() on shapes first). @throws CommunicationError.
  template <class Scalar>
  void all_reduce_sum(std::span<Scalar> values) const;

  /// Every rank's `local` (all the same length, checked), concatenated in rank order.
  /// @throws ShapeError if the lengths differ; CommunicationError.
  template <class Scalar>
  std::vector<std::remove_const_t<Scalar>> all_gather(std::span<Scalar> local) const;

  /// Checks that every rank holds the same `values` (shapes, sizes, configs): a collective of
  /// two small all-reduces (min and max). @throws ShapeError, the same text on every rank,
  /// "<op>: ranks disagree about <what>: entry i is a on some ranks and b on others", if they
  /// differ (in length, too); CommunicationError.
  void agree(std::string_view op, std::span<const std::int64_t> values,
             std::string_view what = "the shapes") const;

  /// all_reduce_sum's counters (for benchmarks: how much of a step is communication).
  const CommunicationStats& stats() const { return stats_; }
  void reset_stats() const { stats_ = {}; }

 private:
  void check(int code, const char* call) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  mutable CommunicationStats stats_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <class Scalar>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<Scalar, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<Scalar, double>) {
    return MPI_DOUBLE;
  } else {
    static_assert(std::is_same_v<Scalar, std::int64_t>,
                  "dissect::parallel: collectives carry float, double or int64");
    return MPI_INT64_T;
  }
}

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

inline void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw CommunicationError(
        dissect::detail::concat("dissect::parallel: ", call, " failed: ", mpi_error_text(code)));
  }
}

}  // namespace detail

inline Communicator::Communicator(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    throw CommunicationError("Communicator: MPI is not initialised (call MPI_Init first)");
  }
  // The user's communicator keeps its error handler; only our duplicate returns errors.
  detail::check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

inline Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

inline Communicator::Communicator(Communicator&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      size_(other.size_),
      stats_(other.stats_) {}

inline void Communicator::check(int code, const char* call) const {
  detail::check_mpi(code, call);
}

template <class Scalar>
void Communicator::all_reduce_sum(std::span<Scalar> values) const {
  const double start = MPI_Wtime();
  check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()),
                      detail::mpi_type<Scalar>(), MPI_SUM, comm_),
        "MPI_Allreduce");
  stats_.seconds += MPI_Wtime() - start;
  stats_.bytes += static_cast<std::int64_t>(values.size_bytes());
  ++stats_.all_reduces;
}

template <class Scalar>
std::vector<std::remove_const_t<Scalar>> Communicator::all_gather(std::span<Scalar> local) const {
  using Value = std::remove_const_t<Scalar>;
  const std::int64_t length = static_cast<std::int64_t>(local.size());
  agree("Communicator::all_gather", std::span<const std::int64_t>(&length, 1),
        "the length of their parts");
  std::vector<Value> result(local.size() * static_cast<std::size_t>(size_));
  check(MPI_Allgather(local.data(), static_cast<int>(local.size()), detail::mpi_type<Value>(),
                      result.data(), static_cast<int>(local.size()), detail::mpi_type<Value>(),
                      comm_),
        "MPI_Allgather");
  return result;
}

inline void Communicator::agree(std::string_view op, std::span<const std::int64_t> values,
                                std::string_view what) const {
  // Lengths first, so that the second all-reduce has the same count on every rank. MIN of
  // (v, −v) gives min and −max in one call.
  const auto length = static_cast<std::int64_t>(values.size());
  std::int64_t lengths[2] = {length, -length};
  check(MPI_Allreduce(MPI_IN_PLACE, lengths, 2, MPI_INT64_T, MPI_MIN, comm_), "MPI_Allreduce");
  if (lengths[0] != -lengths[1]) {
    throw ShapeError(dissect::detail::concat(op, ": ranks disagree about ", what, ": they hold ",
                                             lengths[0], " values on some ranks and ", -lengths[1],
                                             " on others"));
  }
  std::vector<std::int64_t> bounds(2 * values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    bounds[2 * i] = values[i];
    // −v overflows only for INT64_MIN, which no shape or config holds; keep it well defined.
    bounds[2 * i + 1] = values[i] == INT64_MIN ? INT64_MAX : -values[i];
  }
  check(MPI_Allreduce(MPI_IN_PLACE, bounds.data(), static_cast<int>(bounds.size()), MPI_INT64_T,
                      MPI_MIN, comm_),
        "MPI_Allreduce");
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (bounds[2 * i] != -bounds[2 * i + 1]) {
      throw ShapeError(dissect::detail::concat(op, ": ranks disagree about ", what, ": entry ", i,
                                               " is ", bounds[2 * i], " on some ranks and ",
                                               -bounds[2 * i + 1], " on others"));
    }
  }
}

}  // namespace dissect::parallel
