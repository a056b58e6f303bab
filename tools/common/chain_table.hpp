// tools/common/chain_table.hpp — a ShapeChain printed as a table, one row per step.
//
// The layout of a shape chain on a terminal: the dimensions, then step, operation, symbolic and
// numeric shape and FLOPs for each step, the totals by kind, the blind spots (axes of equal size
// that a check cannot tell apart) and the chain's notes. The chain itself
// (dissect/accounting/shape_chain.hpp) only checks and records; this is how tools and examples show
// it.
#pragma once

#include <string>
#include <vector>

#include "dissect/accounting/shape_chain.hpp"
#include "dissect/core/shape.hpp"
#include "tools/common/table.hpp"

namespace dissect::tools {

/// The chain as text. Conventions, printed under the rows: the FLOPs column is one pass of the
/// step, 2·M·N·K per matrix product; "×L" marks a step that runs in every layer, which the totals
/// count L times; "-" marks a lookup or elementwise step, whose work is not counted.
inline std::string chain_table(const ShapeChain& chain) {
  TextTable table({false, false, false, false, true, false});
  table.add_row({"step", "operation", "symbolic shape", "numeric shape", "FLOPs", ""});
  table.add_rule();
  bool any_per_layer = false;
  for (const ChainStep& step : chain.steps()) {
    any_per_layer = any_per_layer || step.cost.per_layer;
    table.add_row({step.stage, step.operation, step.shape.symbolic_text(),
                   step.shape.numeric_text(),
                   step.cost.flops > 0 ? format_count(step.cost.flops) : "-",
                   step.cost.per_layer ? "×L" : ""});
  }

  std::string out = "dimensions: " + chain.dims().to_string() + '\n' + table.render();
  out += "FLOPs: 2·M·N·K per matrix product, one pass of the step";
  if (any_per_layer)
    out += "; ×L: once in each layer, L = " + std::to_string(chain.dims().size_of("L"));
  out += ";\n\"-\": lookups and elementwise steps, not counted.\n";
  out += "total: " + format_count(chain.total_flops()) + " FLOPs";
  const index_t linear = chain.flops_of(StepKind::linear);
  const index_t attention = chain.flops_of(StepKind::attention);
  const index_t other = chain.flops_of(StepKind::other);
  if (linear > 0 || attention > 0) {
    out += " = linear steps " + format_count(linear) + " + attention products " +
           format_count(attention);
    if (other > 0) out += " + other " + format_count(other);
  }
  out += '\n';

  bool blind = false;
  for (const ChainStep& step : chain.steps()) {
    if (step.blind_spots.empty()) continue;
    if (!blind) out += "blind spots (equal sizes: a check cannot see these axes swapped):\n";
    blind = true;
    std::string groups;
    for (const AmbiguousAxes& group : step.blind_spots) {
      groups += (groups.empty() ? "" : "; ") + group.describe();
    }
    out += "  " + step.stage + " " + step.shape.symbolic_text() + ": " + groups + '\n';
  }
  for (const std::string& note : chain.notes()) out += note + '\n';
  return out;
}

}  // namespace dissect::tools
