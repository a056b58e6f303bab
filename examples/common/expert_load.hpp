// examples/common/expert_load.hpp — how a mixture-of-experts model spreads its tokens over its
// experts during training: per layer and expert, the share of the routed token slots (B·T tokens
// times k choices per layer and step) that went to that expert, summed over a report interval.
//
// NOT part of the dissect library: example-only (train_gpt's --experts runs). It reads what the
// training forward already keeps, MoeRoute::assigned in each layer's cache, so it costs E
// additions per layer and step. A perfectly balanced router gives every expert 1/E.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "dissect/core/shape.hpp"

namespace dissect::examples {

/// The load of L layers × E experts, one row [L·E] (layer-major) per report.
class ExpertLoad {
 public:
  ExpertLoad(index_t layers, index_t experts)
      : layers_(layers),
        experts_(experts),
        counts_(static_cast<std::size_t>(layers * experts), 0.0) {}

  index_t layers() const { return layers_; }
  index_t experts() const { return experts_; }

  /// Adds one training step's routing: `cache` is a DecoderModel's Cache of a mixture-of-experts
  /// style (cache.layers[l].ffn.route). Assignments dropped by a capacity count where they were
  /// sent (MoeRoute::assigned): the load is the router's choice.
  template <class ModelCache>
  void add(const ModelCache& cache) {
    for (index_t l = 0; l < layers_; ++l) {
      const auto& route = cache.layers[static_cast<std::size_t>(l)].ffn.route;
      for (index_t e = 0; e < experts_; ++e) {
        counts_[static_cast<std::size_t>(l * experts_ + e)] +=
            static_cast<double>(route.assigned[static_cast<std::size_t>(e)]);
      }
      if (l == 0) slots_ += static_cast<double>(route.tokens * route.top_k);
    }
  }

  /// Closes the interval ending at `step`: its shares become a row, the counts start again.
  void report(index_t step) {
    std::vector<double> shares(counts_.size(), 0.0);
    if (slots_ > 0) {
      for (std::size_t i = 0; i < counts_.size(); ++i) shares[i] = counts_[i] / slots_;
    }
    steps_.push_back(static_cast<double>(step));
    rows_.push_back(std::move(shares));
    std::fill(counts_.begin(), counts_.end(), 0.0);
    slots_ = 0;
  }

  /// The report steps, and the rows: rows()[r][l·E + e] is expert e's share in layer l.
  const std::vector<double>& steps() const { return steps_; }
  const std::vector<std::vector<double>>& rows() const { return rows_; }

  /// Expert e's share in layer l at each report.
  std::vector<double> series(index_t layer, index_t expert) const {
    std::vector<double> out;
    for (const auto& row : rows_)
      out.push_back(row[static_cast<std::size_t>(layer * experts_ + expert)]);
    return out;
  }
  /// Expert e's share averaged over the layers, at each report.
  std::vector<double> mean_series(index_t expert) const {
    std::vector<double> out(rows_.size(), 0.0);
    for (index_t l = 0; l < layers_; ++l) {
      const auto one = series(l, expert);
      for (std::size_t r = 0; r < out.size(); ++r) out[r] += one[r] / static_cast<double>(layers_);
    }
    return out;
  }

 private:
  index_t layers_, experts_;
  std::vector<double> counts_;  ///< [L·E] assignments of the current interval
  double slots_ = 0;            ///< N·k summed over the interval's steps (one layer's)
  std::vector<double> steps_;
  std::vector<std::vector<double>> rows_;
};

}  // namespace dissect::examples
