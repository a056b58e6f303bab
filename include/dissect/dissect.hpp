// dissect/dissect.hpp — the umbrella header: everything the library offers, in one include.
//
// Prefer the single headers in your own code (dissect/linear.hpp, dissect/count.hpp, …) to keep
// compile times down; this one is for examples, notebooks and quick experiments.
#pragma once

#include "dissect/activation.hpp"
#include "dissect/attention.hpp"
#include "dissect/blocks.hpp"
#include "dissect/budget.hpp"
#include "dissect/config.hpp"
#include "dissect/count.hpp"
#include "dissect/embedding.hpp"
#include "dissect/error.hpp"
#include "dissect/forward_chain.hpp"
#include "dissect/init.hpp"
#include "dissect/kernels.hpp"
#include "dissect/kv_cache.hpp"
#include "dissect/linear.hpp"
#include "dissect/lora.hpp"
#include "dissect/lora_adapter.hpp"
#include "dissect/loss.hpp"
#include "dissect/model_shape.hpp"
#include "dissect/models/decoder_layer.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/models/styles.hpp"
#include "dissect/norm.hpp"
#include "dissect/optim.hpp"
#include "dissect/rope.hpp"
#include "dissect/sampling.hpp"
#include "dissect/shape.hpp"
#include "dissect/shape_chain.hpp"
#include "dissect/tensor.hpp"
