// dissect/quant/quantize.hpp — moved to dissect/transforms/quantize.hpp: quantize_model takes a
// whole module, so it sits above the layers, beside apply_lora, while quant/ holds the formats
// and kernels below Linear. This forwarding header stays for one release.
#pragma once

#include "dissect/transforms/quantize.hpp"
