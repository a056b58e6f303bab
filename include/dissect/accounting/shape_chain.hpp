// dissect/accounting/shape_chain.hpp — named dimensions, and a chain that checks and records every
// shape.
//
// DimensionTable gives the dimension letters (B, T, D, H, d_k, F, L, V) their sizes. ShapeChain
// checks real shapes against symbolic ones ("B H T d_k") stage by stage, explains a mismatch in
// those letters (which axes are swapped, or every reading that fits when sizes coincide), and
// records each step with its FLOPs. The checker only: a transformer's own chain is built in
// forward_chain.hpp, and printing a chain as a table is left to tools and examples. Shapes and
// counts only: no tensor value is ever read.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A symbolic shape resolved against a DimensionTable: one symbol and one size per axis.
struct SymbolicShape {
  std::vector<std::string> symbols;  ///< per axis: "B", "d_k", or a product such as "H*d_k"
  std::vector<index_t> sizes;        ///< per axis, from the table; every one > 0

  std::size_t rank() const { return symbols.size(); }
  std::string symbolic_text() const;  ///< "[B, H, T, d_k]"
  std::string numeric_text() const;   ///< "[2, 2, 5, 4]"
};

/// Distinct symbols of one shape that share a size. A check on sizes cannot tell these axes
/// apart: a tensor with them swapped passes it.
struct AmbiguousAxes {
  index_t size = 0;
  std::vector<std::string> symbols;  ///< two or more, in the order their axes first appear

  std::string describe() const;  ///< "H = T = 5"
};

/// Symbol → size, kept in the order the symbols were added (the order tables print them in).
///
/// A symbolic shape names one axis per item, separated by spaces or commas and optionally
/// bracketed: "B H T d_k", "[B, H, T, d_k]". An item is a symbol, a positive integer, or a
/// product of those joined by '*' ("H*d_k", "3*D").
class DimensionTable {
 public:
  DimensionTable() = default;

  /// The table {B=2, T=5, …}, in the order given.
  /// @throws ShapeError for a symbol that is not an identifier, a repeated symbol or a size <= 0.
  DimensionTable(std::initializer_list<std::pair<std::string_view, index_t>> entries);

  /// Adds `symbol` = `size`. A symbol is a letter or '_' followed by letters, digits or '_'.
  /// @throws ShapeError for a malformed or repeated symbol or a size <= 0 (table unchanged).
  DimensionTable& add(std::string_view symbol, index_t size);

  bool contains(std::string_view symbol) const;

  /// The size of `symbol`. @throws ShapeError if the table has no such symbol.
  index_t size_of(std::string_view symbol) const;

  /// Every symbol whose size is `size`, in table order: what a bare number could stand for.
  std::vector<std::string> symbols_of_size(index_t size) const;

  const std::vector<std::pair<std::string, index_t>>& entries() const { return entries_; }

  /// "B=2, T=5, D=8".
  std::string to_string() const;

  /// The axes of `symbolic` with their sizes.
  /// @throws ShapeError for an empty or malformed shape, an unknown symbol, a factor <= 0, or a
  ///         product that overflows int64.
  SymbolicShape resolve(std::string_view symbolic) const;

 private:
  std::vector<std::pair<std::string, index_t>> entries_;
};

/// The groups of distinct symbols of `shape` that share a size (empty when a check on sizes
/// sees every axis). Within [B, H, T, d_k] with H = T = 5 that is {5: H, T}.
std::vector<AmbiguousAxes> ambiguous_axes(const SymbolicShape& shape);

/// ambiguous_axes of `symbolic` resolved against `dims`.
/// @throws ShapeError as DimensionTable::resolve.
std::vector<AmbiguousAxes> ambiguous_axes(const DimensionTable& dims, std::string_view symbolic);

/// What a step's FLOPs are: a product by a weight matrix (the "linear steps", whose FLOPs are
/// 2 · weights · tokens), a product between activations inside attention, or anything else.
enum class StepKind { other, linear, attention };

/// The cost of one step: FLOPs of one pass of it, and whether it runs once in each of the L
/// layers (the chain then multiplies by the table's L when it sums).
struct StepCost {
  index_t flops = 0;
  bool per_layer = false;
  StepKind kind = StepKind::other;
};

/// One recorded step of a chain.
struct ChainStep {
  std::string stage;      ///< "head split"
  std::string operation;  ///< "reshape + transpose"
  SymbolicShape shape;    ///< what the step produces
  StepCost cost;
  index_t total_flops = 0;                 ///< cost.flops, times L for a per-layer step
  std::vector<AmbiguousAxes> blind_spots;  ///< ambiguous_axes(shape): swaps a check cannot see
};

/// A forward pass written down step by step: each step is checked against a real shape (expect)
/// or recorded from its symbols alone (record), with the FLOPs of one pass of it (2·M·N·K per
/// matrix product; 0 for a lookup or elementwise step, whose work is not counted). A per-layer
/// step counts L times in the sums.
class ShapeChain {
 public:
  explicit ShapeChain(DimensionTable dims) : dims_(std::move(dims)) {}

  const DimensionTable& dims() const { return dims_; }

  /// Checks that `actual` is `symbolic` under the table, then records the step.
  /// A pass proves nothing about axes of equal size: the step's blind_spots name them.
  /// The returned reference is valid until the next step is added.
  /// @throws ShapeError naming the stage and printing the expected symbolic and numeric shapes
  ///         and the actual one: which axes are swapped when `actual` holds the expected sizes in
  ///         another order (every reading that fits, when equal sizes allow several); which axis
  ///         differs otherwise; a rank mismatch; or anything DimensionTable::resolve rejects.
  ///         Also as record. The chain is unchanged after a throw.
  const ChainStep& expect(std::string_view stage, std::span<const index_t> actual,
                          std::string_view symbolic, std::string_view operation = {},
                          StepCost cost = {});

  /// expect on `tensor.shape()`: a Tensor, or anything else whose shape() gives extents.
  template <class TensorLike>
  requires requires(const TensorLike& tensor) { std::span<const index_t>(tensor.shape()); }
  const ChainStep& expect(std::string_view stage, const TensorLike& tensor,
                          std::string_view symbolic, std::string_view operation = {},
                          StepCost cost = {}) {
    return expect(stage, std::span<const index_t>(tensor.shape()), symbolic, operation, cost);
  }

  /// Records a step from its symbols alone (no tensor at hand).
  /// @throws ShapeError as DimensionTable::resolve; for a per-layer step without L in the table;
  ///         for FLOPs that overflow int64. @throws Error for negative FLOPs. Chain unchanged.
  const ChainStep& record(std::string_view stage, std::string_view symbolic,
                          std::string_view operation = {}, StepCost cost = {});

  /// A remark about the chain as a whole (a renderer prints it under the steps).
  void add_note(std::string note) { notes_.push_back(std::move(note)); }

  const std::vector<ChainStep>& steps() const { return steps_; }
  const std::vector<std::string>& notes() const { return notes_; }

  /// Σ total_flops over the steps (per-layer steps count L times).
  index_t total_flops() const { return total_flops_; }

  /// Σ total_flops over the steps of one kind.
  index_t flops_of(StepKind kind) const;

 private:
  const ChainStep& push(std::string_view stage, std::string_view operation, SymbolicShape shape,
                        StepCost cost, std::string_view context);

  DimensionTable dims_;
  std::vector<ChainStep> steps_;
  std::vector<std::string> notes_;
  index_t total_flops_ = 0;
};

// ---- implementation: helpers --------------------------------------------------------------------

namespace detail::chain {

template <class Item>
std::string bracketed(std::span<const Item> items) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << items[i];
  out << ']';
  return out.str();
}

inline std::string listed(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    out += items[i];
  }
  return out;
}

inline bool is_identifier(std::string_view text) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (text.empty() || !letter(text.front())) return false;
  return std::all_of(text.begin(), text.end(), [&](char c) { return letter(c) || digit(c); });
}

inline bool is_number(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// The items of a symbolic shape: brackets dropped, split at spaces and commas.
inline std::vector<std::string_view> split_axes(std::string_view symbolic) {
  std::vector<std::string_view> items;
  std::size_t start = 0;
  auto separator = [](char c) { return c == ' ' || c == ',' || c == '\t' || c == '[' || c == ']'; };
  for (std::size_t i = 0; i <= symbolic.size(); ++i) {
    if (i == symbolic.size() || separator(symbolic[i])) {
      if (i > start) items.push_back(symbolic.substr(start, i - start));
      start = i + 1;
    }
  }
  return items;
}

inline SymbolicShape resolve(const DimensionTable& dims, std::string_view symbolic,
                             std::string_view context) {
  const std::vector<std::string_view> items = split_axes(symbolic);
  if (items.empty()) {
    throw ShapeError(concat(context, ": empty symbolic shape \"", symbolic, "\""));
  }
  SymbolicShape shape;
  for (std::string_view item : items) {
    index_t size = 1;
    std::size_t start = 0;
    for (std::size_t i = 0; i <= item.size(); ++i) {
      if (i < item.size() && item[i] != '*') continue;
      const std::string_view factor = item.substr(start, i - start);
      start = i + 1;
      index_t value = 0;
      if (is_identifier(factor)) {
        if (!dims.contains(factor)) {
          throw ShapeError(concat(context, ": unknown dimension symbol \"", factor, "\" in \"",
                                  symbolic, "\" (the table has ", dims.to_string(), ")"));
        }
        value = dims.size_of(factor);
      } else if (is_number(factor)) {
        const auto [end, error] =
            std::from_chars(factor.data(), factor.data() + factor.size(), value);
        if (error != std::errc{} || end != factor.data() + factor.size() || value <= 0) {
          throw ShapeError(concat(context, ": factor ", factor, " in \"", symbolic,
                                  "\" must be a positive integer that fits int64"));
        }
      } else {
        throw ShapeError(concat(context, ": \"", item, "\" in \"", symbolic,
                                "\" is not a dimension: use a symbol (a letter or '_', then "
                                "letters, digits or '_'), a positive integer, or a product of "
                                "those joined by '*'"));
      }
      size = checked_mul(size, value, concat(context, ": size of \"", item, "\""));
    }
    shape.symbols.emplace_back(item);
    shape.sizes.push_back(size);
  }
  return shape;
}

/// One way to read an actual shape as a reordering of the expected axes.
struct Reading {
  std::vector<std::string> symbols;  ///< the symbol each actual axis would carry
  std::vector<std::size_t> moved;    ///< axes whose symbol differs from the expected one
};

/// Every distinct assignment of expected axes to actual axes with equal sizes, up to `limit`.
/// Called only when the two shapes hold the same multiset of sizes, so every partial assignment
/// completes and the search costs no more than what it finds.
inline void find_readings(const SymbolicShape& expected, std::span<const index_t> actual,
                          std::vector<bool>& used, std::vector<std::size_t>& chosen,
                          std::vector<Reading>& found, std::size_t limit) {
  const std::size_t axis = chosen.size();
  if (axis == actual.size()) {
    Reading reading;
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      reading.symbols.push_back(expected.symbols[chosen[i]]);
      if (reading.symbols.back() != expected.symbols[i]) reading.moved.push_back(i);
    }
    found.push_back(std::move(reading));
    return;
  }
  for (std::size_t j = 0; j < expected.rank() && found.size() < limit; ++j) {
    if (used[j] || expected.sizes[j] != actual[axis]) continue;
    // Axes that carry the same symbol (the two T of [B, H, T, T]) are interchangeable; trying
    // only the first unused one yields each reading once.
    bool repeat = false;
    for (std::size_t k = 0; k < j && !repeat; ++k) {
      repeat = !used[k] && expected.symbols[k] == expected.symbols[j];
    }
    if (repeat) continue;
    used[j] = true;
    chosen.push_back(j);
    find_readings(expected, actual, used, chosen, found, limit);
    chosen.pop_back();
    used[j] = false;
  }
}

/// "H and T swapped" or "B, H, T reordered"; with `full`, "H and T are swapped (axes 1 and 2)".
inline std::string describe_moves(const SymbolicShape& expected, const Reading& reading,
                                  bool full) {
  std::vector<std::string> names;
  std::vector<std::string> axes;
  for (std::size_t axis : reading.moved) {
    names.push_back(expected.symbols[axis]);
    axes.push_back(std::to_string(axis));
  }
  const bool swap = reading.moved.size() == 2 &&
                    reading.symbols[reading.moved[0]] == expected.symbols[reading.moved[1]] &&
                    reading.symbols[reading.moved[1]] == expected.symbols[reading.moved[0]];
  const std::string_view separator = swap ? " and " : ", ";
  return concat(listed(names, separator), full ? " are " : " ", swap ? "swapped" : "reordered",
                full ? concat(" (axes ", listed(axes, separator), ")") : std::string());
}

/// The explanation after "expected …, got …" for a same-rank mismatch.
inline std::string explain_mismatch(const DimensionTable& dims, const SymbolicShape& expected,
                                    std::span<const index_t> actual) {
  const std::string actual_text = bracketed(actual);
  std::vector<index_t> sorted_expected = expected.sizes;
  std::vector<index_t> sorted_actual(actual.begin(), actual.end());
  std::sort(sorted_expected.begin(), sorted_expected.end());
  std::sort(sorted_actual.begin(), sorted_actual.end());

  if (sorted_expected == sorted_actual) {
    constexpr std::size_t limit = 64;
    constexpr std::size_t shown = 6;
    std::vector<bool> used(expected.rank(), false);
    std::vector<std::size_t> chosen;
    std::vector<Reading> found;
    find_readings(expected, actual, used, chosen, found, limit);
    // Fewest axes moved first: an order for reading the list, not a verdict.
    std::stable_sort(found.begin(), found.end(), [](const Reading& a, const Reading& b) {
      return a.moved.size() < b.moved.size();
    });
    if (found.size() == 1) {
      return concat(", got ", bracketed(std::span<const std::string>(found.front().symbols)), " = ",
                    actual_text, ": ", describe_moves(expected, found.front(), true));
    }
    std::vector<std::string> coincidences;
    for (const AmbiguousAxes& group : ambiguous_axes(expected)) {
      coincidences.push_back(group.describe());
    }
    std::vector<std::string> options;
    for (std::size_t i = 0; i < found.size() && i < shown; ++i) {
      options.push_back(concat(bracketed(std::span<const std::string>(found[i].symbols)), " (",
                               describe_moves(expected, found[i], false), ")"));
    }
    const std::string count =
        found.size() >= limit ? concat("at least ", limit) : std::to_string(found.size());
    std::string more;
    if (found.size() >= limit) {
      more = " or more";
    } else if (found.size() > shown) {
      more = concat(" or ", found.size() - shown, " more");
    }
    return concat(", got ", actual_text, ", the expected sizes in another order; since ",
                  listed(coincidences, " and "), ", ", count,
                  " readings fit and sizes cannot tell which: ", listed(options, " or "), more);
  }

  std::vector<std::string> differences;
  for (std::size_t axis = 0; axis < expected.rank(); ++axis) {
    if (actual[axis] == expected.sizes[axis]) continue;
    std::string difference = concat("axis ", axis, " is ", actual[axis], ", not ",
                                    expected.symbols[axis], " = ", expected.sizes[axis]);
    const std::vector<std::string> names = dims.symbols_of_size(actual[axis]);
    if (!names.empty())
      difference += concat(" (", actual[axis], " is ", listed(names, " or "), ")");
    differences.push_back(std::move(difference));
  }
  return concat(", got ", actual_text, ": ", listed(differences, "; "));
}

/// Element count for a message, or -1 when it cannot be formed (negative extent, overflow).
inline index_t count_or_negative(std::span<const index_t> extents) {
  index_t count = 1;
  for (index_t extent : extents) {
    if (extent < 0 || mul_overflows(count, extent)) return -1;
    count *= extent;
  }
  return count;
}

}  // namespace detail::chain

// ---- implementation: shapes and the table of dimensions -----------------------------------------

inline std::string SymbolicShape::symbolic_text() const {
  return detail::chain::bracketed(std::span<const std::string>(symbols));
}

inline std::string SymbolicShape::numeric_text() const {
  return detail::chain::bracketed(std::span<const index_t>(sizes));
}

inline std::string AmbiguousAxes::describe() const {
  return detail::concat(detail::chain::listed(symbols, " = "), " = ", size);
}

inline DimensionTable::DimensionTable(
    std::initializer_list<std::pair<std::string_view, index_t>> entries) {
  for (const auto& [symbol, size] : entries) add(symbol, size);
}

inline DimensionTable& DimensionTable::add(std::string_view symbol, index_t size) {
  if (!detail::chain::is_identifier(symbol)) {
    throw ShapeError(detail::concat("DimensionTable: \"", symbol,
                                    "\" is not a symbol (a letter or '_', then letters, digits "
                                    "or '_')"));
  }
  if (contains(symbol)) {
    throw ShapeError(detail::concat("DimensionTable: ", symbol, " is listed twice (", symbol, "=",
                                    size_of(symbol), ", then ", symbol, "=", size, ")"));
  }
  if (size <= 0) {
    throw ShapeError(
        detail::concat("DimensionTable: size of ", symbol, " must be > 0 (got ", size, ")"));
  }
  entries_.emplace_back(symbol, size);
  return *this;
}

inline bool DimensionTable::contains(std::string_view symbol) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const auto& entry) { return entry.first == symbol; });
}

inline index_t DimensionTable::size_of(std::string_view symbol) const {
  for (const auto& [name, size] : entries_) {
    if (name == symbol) return size;
  }
  throw ShapeError(detail::concat("DimensionTable: unknown dimension symbol \"", symbol,
                                  "\" (the table has ", to_string(), ")"));
}

inline std::vector<std::string> DimensionTable::symbols_of_size(index_t size) const {
  std::vector<std::string> names;
  for (const auto& [name, value] : entries_) {
    if (value == size) names.push_back(name);
  }
  return names;
}

inline std::string DimensionTable::to_string() const {
  std::string out;
  for (const auto& [name, size] : entries_) {
    out += detail::concat(out.empty() ? "" : ", ", name, "=", size);
  }
  return out.empty() ? "no symbols" : out;
}

inline SymbolicShape DimensionTable::resolve(std::string_view symbolic) const {
  return detail::chain::resolve(*this, symbolic, "DimensionTable::resolve");
}

inline std::vector<AmbiguousAxes> ambiguous_axes(const SymbolicShape& shape) {
  std::vector<AmbiguousAxes> groups;
  for (std::size_t axis = 0; axis < shape.rank(); ++axis) {
    const auto group = std::find_if(groups.begin(), groups.end(), [&](const AmbiguousAxes& g) {
      return g.size == shape.sizes[axis];
    });
    if (group == groups.end()) {
      groups.push_back({shape.sizes[axis], {shape.symbols[axis]}});
    } else if (std::find(group->symbols.begin(), group->symbols.end(), shape.symbols[axis]) ==
               group->symbols.end()) {
      group->symbols.push_back(shape.symbols[axis]);
    }
  }
  std::erase_if(groups, [](const AmbiguousAxes& g) { return g.symbols.size() < 2; });
  return groups;
}

inline std::vector<AmbiguousAxes> ambiguous_axes(const DimensionTable& dims,
                                                 std::string_view symbolic) {
  return ambiguous_axes(detail::chain::resolve(dims, symbolic, "ambiguous_axes"));
}

// ---- implementation: ShapeChain -----------------------------------------------------------------

inline const ChainStep& ShapeChain::expect(std::string_view stage, std::span<const index_t> actual,
                                           std::string_view symbolic, std::string_view operation,
                                           StepCost cost) {
  const std::string context = detail::concat("ShapeChain::expect: stage \"", stage, "\"");
  SymbolicShape expected = detail::chain::resolve(dims_, symbolic, context);
  if (actual.size() != expected.rank()) {
    std::string same_data;
    const index_t count = detail::chain::count_or_negative(actual);
    if (count >= 0 && count == detail::chain::count_or_negative(expected.sizes)) {
      same_data = detail::concat(" (both hold ", count,
                                 " elements: the same data, split into different axes)");
    }
    throw ShapeError(detail::concat(context, ": expected rank ", expected.rank(), " ",
                                    expected.symbolic_text(), " = ", expected.numeric_text(),
                                    ", got rank ", actual.size(), " ",
                                    detail::chain::bracketed(actual), same_data));
  }
  if (!std::equal(actual.begin(), actual.end(), expected.sizes.begin())) {
    throw ShapeError(detail::concat(context, ": expected ", expected.symbolic_text(), " = ",
                                    expected.numeric_text(),
                                    detail::chain::explain_mismatch(dims_, expected, actual)));
  }
  return push(stage, operation, std::move(expected), cost, context);
}

inline const ChainStep& ShapeChain::record(std::string_view stage, std::string_view symbolic,
                                           std::string_view operation, StepCost cost) {
  const std::string context = detail::concat("ShapeChain::record: stage \"", stage, "\"");
  return push(stage, operation, detail::chain::resolve(dims_, symbolic, context), cost, context);
}

inline const ChainStep& ShapeChain::push(std::string_view stage, std::string_view operation,
                                         SymbolicShape shape, StepCost cost,
                                         std::string_view context) {
  if (cost.flops < 0) {
    throw Error(detail::concat(context, ": FLOPs must be >= 0 (got ", cost.flops, ")"));
  }
  index_t step_flops = cost.flops;
  if (cost.per_layer) {
    if (!dims_.contains("L")) {
      throw ShapeError(detail::concat(context, ": a per-layer step needs L in the table (",
                                      dims_.to_string(), ")"));
    }
    step_flops =
        checked_mul(cost.flops, dims_.size_of("L"), detail::concat(context, ": FLOPs × L"));
  }
  const index_t total =
      checked_add(total_flops_, step_flops, detail::concat(context, ": total FLOPs"));
  ChainStep step;
  step.stage = stage;
  step.operation = operation;
  step.blind_spots = ambiguous_axes(shape);
  step.shape = std::move(shape);
  step.cost = cost;
  step.total_flops = step_flops;
  steps_.push_back(std::move(step));  // the last thing that can throw: nothing changed before it
  total_flops_ = total;
  return steps_.back();
}

inline index_t ShapeChain::flops_of(StepKind kind) const {
  index_t sum = 0;
  // Cannot overflow: every partial sum is bounded by total_flops_, checked in push.
  for (const ChainStep& step : steps_) {
    if (step.cost.kind == kind) sum += step.total_flops;
  }
  return sum;
}

}  // namespace dissect
