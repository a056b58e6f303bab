// dissect/loss.hpp — moved to dissect/training/loss.hpp (its layer's folder, docs/architecture.md);
// this forwarding header is kept for one release so that code written before the move compiles.
#pragma once

#include "dissect/training/loss.hpp"
