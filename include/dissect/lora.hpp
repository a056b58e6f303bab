// dissect/lora.hpp — LoRA, layer and model: LoRALinear (lora_linear.hpp) and apply_lora,
// merge_adapters, unmerge_adapters (transforms/lora.hpp). An umbrella kept so that code written
// before the split compiles unchanged; include the one you need.
#pragma once

#include "dissect/layers/lora_linear.hpp"
#include "dissect/transforms/lora.hpp"
