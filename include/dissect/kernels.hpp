// dissect/kernels.hpp — moved to dissect/kernels/linear_products.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/kernels/linear_products.hpp"
