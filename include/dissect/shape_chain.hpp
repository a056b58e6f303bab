// dissect/shape_chain.hpp — moved to dissect/accounting/shape_chain.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/accounting/shape_chain.hpp"
