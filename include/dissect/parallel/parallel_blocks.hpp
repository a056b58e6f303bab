// dissect/parallel/parallel_blocks.hpp — the tensor-parallel blocks (Megatron-LM), one include:
// parallel_feed_forward.hpp (FFN, SwiGLU) and parallel_attention.hpp (causal self-attention).
#pragma once

#include "dissect/parallel/parallel_attention.hpp"
#include "dissect/parallel/parallel_feed_forward.hpp"
