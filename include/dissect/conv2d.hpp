// dissect/conv2d.hpp — moved to dissect/layers/conv2d.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/layers/conv2d.hpp"
