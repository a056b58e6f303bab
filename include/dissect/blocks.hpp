// dissect/blocks.hpp — the linear blocks of a transformer layer, each a few Linear layers.
//
// QKVProjection is GPT-2's c_attn: one fused weight whose output splits into per-head q, k, v
// [B, H, T, d_k] (with fewer k/v heads for grouped-query attention). AttentionOutput merges the
// heads back to [B, T, D] and projects them (c_proj). FeedForward is GPT-2's MLP, D → F → D;
// GatedFeedForward is LLaMA's SwiGLU. Every block checks its shapes at the boundary, and its
// backward returns the input gradient and adds into the gradients of its Linear members.
//
// An umbrella: each block has its own header in dissect/blocks/ (qkv_projection.hpp,
// attention_output.hpp, feed_forward.hpp, gated_feed_forward.hpp) and this one includes all four,
// so code that includes dissect/blocks.hpp keeps compiling. QKV alone is dissect/attention/qkv.hpp.
#pragma once

#include "dissect/blocks/attention_output.hpp"
#include "dissect/blocks/feed_forward.hpp"
#include "dissect/blocks/gated_feed_forward.hpp"
#include "dissect/blocks/qkv_projection.hpp"
