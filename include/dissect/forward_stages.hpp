// dissect/forward_stages.hpp — moved to dissect/core/forward_stages.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/core/forward_stages.hpp"
