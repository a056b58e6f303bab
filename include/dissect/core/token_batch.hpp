// dissect/core/token_batch.hpp — TokenBatch: B sequences of T token ids, the input of every model
// forward, of the embedding that reads it and of the KV caches that record it.
//
// Token ids are integers, which Tensor does not hold, so they travel as a span in row-major
// order. It lives in core, below every layer that passes it on, so that a cache (attention/) can
// name it without including the embedding (layers/embedding.hpp, which includes this header).
#pragma once

#include <span>

#include "dissect/core/shape.hpp"

namespace dissect {

/// B sequences of T token ids, row-major: ids[b·T + t] is the token at [b, t]. A non-owning view
/// (keep the ids alive during the call), checked by the layer that reads it: ids.size() must be
/// B·T and every id must lie in [0, V).
struct TokenBatch {
  std::span<const index_t> ids;
  index_t batch;  ///< B
  index_t seq;    ///< T
};

}  // namespace dissect
