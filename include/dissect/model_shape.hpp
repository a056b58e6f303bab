// dissect/model_shape.hpp — moved to dissect/accounting/model_shape.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/accounting/model_shape.hpp"
