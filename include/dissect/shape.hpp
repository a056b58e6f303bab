// dissect/shape.hpp — moved to dissect/core/shape.hpp (its layer's folder, docs/architecture.md);
// this forwarding header is kept for one release so that code written before the move compiles.
#pragma once

#include "dissect/core/shape.hpp"
