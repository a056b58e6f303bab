// dissect/blocks/block_options.hpp — BlockOptions: how a block builds its Linear layers.
//
// Every block of blocks/ takes LinearOptions for all its layers at once; with a seed, its layers
// take consecutive seeds in a fixed order, so a block built twice from one seed is the same
// block. QKVOptions and GatedFeedForwardOptions extend it beside their blocks.
#pragma once

#include <cstdint>
#include <optional>

#include "dissect/layers/linear.hpp"
#include "dissect/tensor/init.hpp"

namespace dissect {

/// How a block builds its Linear layers: LinearOptions applied to all of them. With a seed, the
/// block's layers take seed, seed + 1, … in the order their accessors are listed below; without
/// one, each draws the next default seed (see manual_seed).
using BlockOptions = LinearOptions;

namespace detail {

/// The options of a block's `index`-th Linear: consecutive seeds from one block seed.
inline LinearOptions member_options(bool bias, InitScheme init, std::optional<std::uint64_t> seed,
                                    std::uint64_t index) {
  return {.bias = bias,
          .init = init,
          .seed = seed ? std::optional<std::uint64_t>(*seed + index) : std::nullopt};
}

}  // namespace detail

}  // namespace dissect
