// dissect/rolling_kv_cache.hpp — moved to dissect/attention/rolling_kv_cache.hpp (its layer's
// folder, docs/architecture.md); this forwarding header is kept for one release so that code
// written before the move compiles.
#pragma once

#include "dissect/attention/rolling_kv_cache.hpp"
