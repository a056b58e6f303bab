// dissect/cross_attention.hpp — moved to dissect/attention/cross_attention.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/attention/cross_attention.hpp"
