// dissect/parallel/communicator.hpp — the MPI communicator the tensor-parallel layers share.
//
// Communicator wraps a communicator the user owns (MPI_COMM_WORLD or a split of it): it never
// calls MPI_Init or MPI_Finalize and never changes the user's communicator. It duplicates it, so
// the layers' collectives cannot match the user's own messages, and sets MPI_ERRORS_RETURN on the
// duplicate only, so an MPI failure becomes a CommunicationError instead of an abort.
//
// agree() is how ranks stay in step. A rank that throws while its peers go on into a collective
// leaves them waiting there for ever, so every public parallel call runs its rank-local part
// (checks, and local work up to its first collective) inside agree(op, facts, local): each rank
// runs it, then one small all-reduce settles the outcome — whether any rank failed, and digests
// of the call, of its shapes and of the values that must be replicated (CallFacts). If any rank
// failed, every rank throws that rank's error (the lowest one's, its kind and its text, naming
// it); if the ranks disagree, every rank throws the same ShapeError. Only then do the ranks
// enter the call's collectives.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// An MPI call that failed: the message names the call and MPI's own error text.
struct CommunicationError : Error {
  using Error::Error;
};

/// What all_reduce_sum has done since construction or reset_stats(): calls, payload bytes (per
/// rank: the buffer's size, not what the MPI algorithm sends on the wire) and wall seconds spent
/// inside MPI_Allreduce (waiting for slower ranks included). The agreements are counted apart:
/// calls of agree(op, facts, local) and the seconds inside their one small all-reduce (not the
/// local part's); the shape-only agree(op, values) is not counted.
struct CommunicationStats {
  std::int64_t all_reduces = 0;
  std::int64_t bytes = 0;
  double seconds = 0;
  std::int64_t agreements = 0;
  double agreement_seconds = 0;
};

/// A 64-bit digest of bytes, to check that ranks hold bitwise the same values (a replicated
/// input, a full layer about to be split) without sending them: one pass over the bytes in four
/// independent lanes of multiply-rotate mixing, about a cycle per 8 bytes (memory speed), so
/// checksumming x [B, T, D] costs far less than any product with it. Not cryptographic: it
/// catches a mistake, not an adversary (two different inputs collide with probability ~2⁻⁶⁴).
/// Bits, not values: −0.0 and +0.0, or two NaNs of other payloads, differ.
class Checksum {
 public:
  Checksum& add_bytes(const void* data, std::size_t size);
  template <class T, std::size_t Extent>
  requires std::is_trivially_copyable_v<T> Checksum& add(std::span<T, Extent> values) {
    return add_bytes(values.data(), values.size_bytes());
  }
  template <class T>
  requires std::is_arithmetic_v<T> Checksum& add(T value) {
    return add_bytes(&value, sizeof value);
  }
  std::uint64_t value() const;

 private:
  std::array<std::uint64_t, 4> lanes_ = {0x243F6A8885A308D3u, 0x13198A2E03707344u,
                                         0xA4093822299F31D0u, 0x082EFA98EC4E6C89u};
  std::uint64_t bytes_ = 0;
};

/// Values one call must hold bitwise alike on every rank, for agree(): their Checksum and the
/// words that name them in the error ("x", "the full layer's weight and bias").
struct Replicated {
  std::string_view what;
  std::uint64_t checksum = 0;
};

/// What agree(op, facts, local) compares across ranks, besides the call itself (op).
struct CallFacts {
  /// Shapes and sizes every rank must hold alike (each input's rank and extents, a layer's
  /// [out, in, bias]); a mismatch is reported entry by entry, as agree(op, values, what) does.
  std::vector<std::int64_t> shapes = {};
  std::string_view shapes_what = "the shapes of their inputs";
  /// Values that must be replicated, compared by checksum; at most max_replicated of them.
  std::vector<Replicated> replicated = {};
  static constexpr std::size_t max_replicated = 3;
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

  /// `out` ← every rank's `local`, concatenated in rank order, into the caller's buffer (no
  /// allocation). `local` may be this rank's own block of `out` (then it is sent in place).
  /// Every rank must pass the same lengths (callers agree on them first, as for all_reduce_sum).
  /// @throws ShapeError if out.size() != size()·local.size(); CommunicationError.
  template <class Scalar>
  void all_gather_into(std::span<const Scalar> local, std::span<Scalar> out) const;

  /// Block p of `send` (send.size()/size() values) goes to rank p; block p of `receive` comes
  /// from rank p. Every rank must pass the same lengths (callers agree on them first).
  /// @throws ShapeError if the lengths differ or size() does not divide them; CommunicationError.
  template <class Scalar>
  void all_to_all(std::span<const Scalar> send, std::span<Scalar> receive) const;

  /// Checks that every rank holds the same `values` (shapes, sizes, configs): a collective of
  /// two small all-reduces (min and max). @throws ShapeError, the same text on every rank,
  /// "<op>: ranks disagree about <what>: entry i is a on some ranks and b on others", if they
  /// differ (in length, too); CommunicationError.
  void agree(std::string_view op, std::span<const std::int64_t> values,
             std::string_view what = "the shapes") const;

  /// Runs `local` (rank-local work: checks, and computation up to the caller's first collective;
  /// it must make no collective call) on this rank, then settles across ranks, in ONE all-reduce
  /// of 11 int64 (88 bytes) whatever the facts, that every rank succeeded, is in the same call
  /// (`op`) and holds the same `facts`; returns what `local` returned. The hot path costs that
  /// all-reduce (a few µs between the processes of one node) plus the checksums the caller
  /// computed; the messages below are built only on failure, with a few more collectives.
  /// @throws, the same kind on every rank:
  ///   - if `local` threw on any rank, the lowest such rank's error, of its kind (ShapeError,
  ///     OverflowError, ConfigError, FormatError, CommunicationError, else Error; std::bad_alloc
  ///     stays std::bad_alloc), its text as "<op>: rank r: <text>" (a leading "<op>: " of the
  ///     text dropped) — or the text alone if every rank threw that very error;
  ///   - Error "<op>: rank r is in another parallel call …" if the ranks are in different calls;
  ///   - ShapeError if `facts.shapes` differ (agree(op, values, what)'s message), or
  ///     "<op>: rank r: the values of <what> differ from rank 0's …" if a replicated checksum
  ///     does;
  ///   - CommunicationError.
  template <class Local>
  requires std::invocable<Local&> std::invoke_result_t<Local&> agree(std::string_view op,
                                                                     const CallFacts& facts,
                                                                     Local&& local)
  const;
  /// The same with no facts: only success and the call are agreed.
  template <class Local>
  requires std::invocable<Local&> std::invoke_result_t<Local&> agree(std::string_view op,
                                                                     Local&& local)
  const { return agree(op, CallFacts{}, local); }

  /// all_reduce_sum's counters (for benchmarks: how much of a step is communication).
  const CommunicationStats& stats() const { return stats_; }
  void reset_stats() const { stats_ = {}; }

 private:
  void check(int code, const char* call) const;
  /// What `local` threw on this rank: its kind (−1: nothing) and text.
  struct LocalOutcome {
    int kind = -1;
    std::string text;
  };
  template <class Run>
  static LocalOutcome run_local(Run&& run);
  /// agree()'s collective part: the one all-reduce, and the errors.
  void settle(std::string_view op, const CallFacts& facts, const LocalOutcome& outcome) const;
  [[noreturn]] void throw_failure(std::string_view op, const LocalOutcome& outcome,
                                  int first) const;
  [[noreturn]] void throw_disagreement(std::string_view op, const CallFacts& facts,
                                       std::span<const std::int64_t> digests) const;

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

// ---- Checksum -----------------------------------------------------------------------------------

namespace detail {

inline std::uint64_t mix_word(std::uint64_t lane, std::uint64_t word) {
  // murmur3's per-block step: every input bit reaches every lane bit within a few words.
  word *= 0x87C37B91114253D5u;
  word = std::rotl(word, 31) * 0x4CF5AD432745937Fu;
  return std::rotl(lane ^ word, 27) * 5 + 0x52DCE729u;
}

inline std::uint64_t finish_word(std::uint64_t h) {  // murmur3's fmix64
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDu;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53u;
  return h ^ (h >> 33);
}

}  // namespace detail

inline Checksum& Checksum::add_bytes(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  // The length first, so that splitting the same bytes into other calls changes the digest.
  lanes_[0] = detail::mix_word(lanes_[0], size);
  std::size_t i = 0;
  for (; i + 32 <= size; i += 32) {  // four independent chains: the multiplies overlap
    for (std::size_t lane = 0; lane < 4; ++lane) {
      std::uint64_t word;
      std::memcpy(&word, bytes + i + 8 * lane, 8);
      lanes_[lane] = detail::mix_word(lanes_[lane], word);
    }
  }
  for (std::size_t lane = 0; i < size; i += 8, ++lane) {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes + i, std::min<std::size_t>(8, size - i));
    lanes_[lane] = detail::mix_word(lanes_[lane], word);
  }
  bytes_ += size;
  return *this;
}

inline std::uint64_t Checksum::value() const {
  std::uint64_t h = bytes_;
  for (std::uint64_t lane : lanes_) h = detail::mix_word(h, detail::finish_word(lane));
  return detail::finish_word(h);
}

// ---- Communicator -------------------------------------------------------------------------------

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

template <class Scalar>
void Communicator::all_gather_into(std::span<const Scalar> local, std::span<Scalar> out) const {
  const std::size_t block = local.size();
  if (out.size() != block * static_cast<std::size_t>(size_)) {
    throw ShapeError(dissect::detail::concat("Communicator::all_gather_into: out holds ",
                                             out.size(), " values, not ", size_, " ranks × ",
                                             block));
  }
  const bool in_place = local.data() == out.data() + block * static_cast<std::size_t>(rank_);
  check(MPI_Allgather(in_place ? MPI_IN_PLACE : local.data(), static_cast<int>(block),
                      detail::mpi_type<Scalar>(), out.data(), static_cast<int>(block),
                      detail::mpi_type<Scalar>(), comm_),
        "MPI_Allgather");
}

template <class Scalar>
void Communicator::all_to_all(std::span<const Scalar> send, std::span<Scalar> receive) const {
  if (send.size() != receive.size() || send.size() % static_cast<std::size_t>(size_) != 0) {
    throw ShapeError(dissect::detail::concat(
        "Communicator::all_to_all: send holds ", send.size(), " values and receive ",
        receive.size(), "; both must be one multiple of the ", size_, " ranks"));
  }
  const int block = static_cast<int>(send.size() / static_cast<std::size_t>(size_));
  check(MPI_Alltoall(send.data(), block, detail::mpi_type<Scalar>(), receive.data(), block,
                     detail::mpi_type<Scalar>(), comm_),
        "MPI_Alltoall");
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

// ---- agree(op, facts, local) --------------------------------------------------------------------

namespace detail {

/// The kinds of error agree() carries from the failing rank to the others.
enum class ErrorKind : int { error, shape, overflow, config, format, communication, bad_alloc };

/// The text of a failing rank's error as the others see it: "<op>: rank r: <text>", where a
/// text that already starts with "<op>: " does not repeat it.
inline std::string rank_message(std::string_view op, int rank, std::string_view text) {
  if (text.size() > op.size() + 1 && text.substr(0, op.size()) == op &&
      text.substr(op.size(), 2) == ": ") {
    text.remove_prefix(op.size() + 2);
  }
  return dissect::detail::concat(op, ": rank ", rank, ": ", text);
}

[[noreturn]] inline void throw_kind(ErrorKind kind, const std::string& text) {
  switch (kind) {
    case ErrorKind::shape:
      throw ShapeError(text);
    case ErrorKind::overflow:
      throw OverflowError(text);
    case ErrorKind::config:
      throw ConfigError(text);
    case ErrorKind::format:
      throw FormatError(text);
    case ErrorKind::communication:
      throw CommunicationError(text);
    case ErrorKind::bad_alloc:
      throw std::bad_alloc();
    case ErrorKind::error:
      break;
  }
  throw Error(text);
}

}  // namespace detail

template <class Run>
Communicator::LocalOutcome Communicator::run_local(Run&& run) {
  using detail::ErrorKind;
  LocalOutcome outcome;
  const auto keep = [&outcome](ErrorKind kind, const char* text) {
    outcome.kind = static_cast<int>(kind);
    try {
      outcome.text = text;
    } catch (...) {  // no memory for the text: the kind still travels, so nobody hangs
      outcome.text.clear();
    }
  };
  // Most derived first: OverflowError is a ShapeError, every dissect error an Error.
  try {
    run();
  } catch (const OverflowError& e) {
    keep(ErrorKind::overflow, e.what());
  } catch (const ShapeError& e) {
    keep(ErrorKind::shape, e.what());
  } catch (const ConfigError& e) {
    keep(ErrorKind::config, e.what());
  } catch (const FormatError& e) {
    keep(ErrorKind::format, e.what());
  } catch (const CommunicationError& e) {
    keep(ErrorKind::communication, e.what());
  } catch (const std::bad_alloc&) {
    keep(ErrorKind::bad_alloc, "out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    keep(ErrorKind::error, e.what());
  } catch (...) {
    keep(ErrorKind::error, "an exception that is not a std::exception");
  }
  return outcome;
}

template <class Local>
requires std::invocable<Local&> std::invoke_result_t<Local&> Communicator::agree(
    std::string_view op, const CallFacts& facts, Local&& local)
const {
  using Result = std::invoke_result_t<Local&>;
  static_assert(!std::is_reference_v<Result>, "agree: the local part must return a value");
  if constexpr (std::is_void_v<Result>) {
    settle(op, facts, run_local(local));
  } else {
    std::optional<Result> result;
    settle(op, facts, run_local([&] { result.emplace(std::invoke(local)); }));
    return std::move(*result);
  }
}

inline void Communicator::settle(std::string_view op, const CallFacts& facts,
                                 const LocalOutcome& outcome) const {
  // One all-reduce (MIN) of a fixed 11 int64, whatever the call: the lowest failing rank (size_
  // if none), then (d, ~d) for each digest — the call, the shapes, the replicated values — so
  // that MIN of ~d gives ~max(d): the digests agree iff min = max. ~d never overflows, and a
  // fixed count means ranks in different calls still meet in a well-formed collective.
  constexpr std::size_t digest_count = 2 + CallFacts::max_replicated;
  if (facts.replicated.size() > CallFacts::max_replicated) {
    throw Error(dissect::detail::concat(op, ": agree takes at most ", CallFacts::max_replicated,
                                        " replicated values, not ", facts.replicated.size()));
  }
  std::array<std::int64_t, digest_count> digests{};
  digests[0] = static_cast<std::int64_t>(Checksum().add_bytes(op.data(), op.size()).value());
  digests[1] = static_cast<std::int64_t>(
      Checksum().add(std::span<const std::int64_t>(facts.shapes)).value());
  for (std::size_t i = 0; i < facts.replicated.size(); ++i) {
    digests[2 + i] = static_cast<std::int64_t>(facts.replicated[i].checksum);
  }
  std::array<std::int64_t, 1 + 2 * digest_count> buffer{};
  buffer[0] = outcome.kind >= 0 ? rank_ : size_;
  for (std::size_t i = 0; i < digest_count; ++i) {
    buffer[1 + 2 * i] = digests[i];
    buffer[2 + 2 * i] = ~digests[i];
  }
  const double start = MPI_Wtime();
  check(MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(buffer.size()), MPI_INT64_T,
                      MPI_MIN, comm_),
        "MPI_Allreduce");
  stats_.agreement_seconds += MPI_Wtime() - start;
  ++stats_.agreements;
  if (buffer[0] < size_) throw_failure(op, outcome, static_cast<int>(buffer[0]));
  for (std::size_t i = 0; i < digest_count; ++i) {
    if (buffer[1 + 2 * i] != ~buffer[2 + 2 * i]) throw_disagreement(op, facts, digests);
  }
}

inline void Communicator::throw_failure(std::string_view op, const LocalOutcome& outcome,
                                        int first) const {
  // The error path only: the failing rank sends its kind and text to all.
  std::int64_t header[2] = {outcome.kind, static_cast<std::int64_t>(outcome.text.size())};
  check(MPI_Bcast(header, 2, MPI_INT64_T, first, comm_), "MPI_Bcast");
  std::string text = rank_ == first ? outcome.text : std::string();
  text.resize(static_cast<std::size_t>(header[1]));
  check(MPI_Bcast(text.data(), static_cast<int>(header[1]), MPI_CHAR, first, comm_), "MPI_Bcast");
  // An error every rank met alike (a split that does not divide, the same wrong shape on every
  // rank) is nobody's in particular: it keeps its own text. Otherwise the text names the rank.
  int everywhere = outcome.kind == header[0] && outcome.text == text ? 1 : 0;
  check(MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
  const auto kind = static_cast<detail::ErrorKind>(header[0]);
  detail::throw_kind(kind, everywhere ? text : detail::rank_message(op, first, text));
}

inline void Communicator::throw_disagreement(std::string_view op, const CallFacts& facts,
                                             std::span<const std::int64_t> digests) const {
  // The error path only: every rank's digests, to name a rank that differs from rank 0. Every
  // rank decides from the same gathered values, so all take the same branch below.
  const std::size_t count = digests.size();
  std::vector<std::int64_t> all(count * static_cast<std::size_t>(size_));
  check(MPI_Allgather(digests.data(), static_cast<int>(count), MPI_INT64_T, all.data(),
                      static_cast<int>(count), MPI_INT64_T, comm_),
        "MPI_Allgather");
  for (std::size_t i = 0; i < count; ++i) {
    for (int r = 1; r < size_; ++r) {
      if (all[static_cast<std::size_t>(r) * count + i] == all[i]) continue;
      if (i == 0) {
        throw Error(dissect::detail::concat(
            op, ": rank ", r, " is in another parallel call than rank 0 (every rank must make the ",
            "same calls, in the same order)"));
      }
      if (i == 1) {
        agree(op, facts.shapes, facts.shapes_what);  // throws the entry-by-entry ShapeError
        throw ShapeError(dissect::detail::concat(op, ": ranks disagree about ", facts.shapes_what));
      }
      const std::string_view what =
          i - 2 < facts.replicated.size() ? facts.replicated[i - 2].what : "a replicated input";
      throw ShapeError(dissect::detail::concat(
          op, ": rank ", r, ": the values of ", what,
          " differ from rank 0's (they must be the same on every rank; compared by a 64-bit ",
          "checksum of their bits)"));
    }
  }
  throw ShapeError(dissect::detail::concat(op, ": ranks disagree"));  // not reached
}

}  // namespace dissect::parallel
