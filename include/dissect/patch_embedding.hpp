// dissect/patch_embedding.hpp — moved to dissect/layers/patch_embedding.hpp (its layer's folder,
// docs/architecture.md); this forwarding header is kept for one release so that code written before
// the move compiles.
#pragma once

#include "dissect/layers/patch_embedding.hpp"
