// dissect/bit_linear.hpp — moved to dissect/layers/bit_linear.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/layers/bit_linear.hpp"
