// dissect/core/forward_stages.hpp — the names of the stages of one forward pass, the lesson's shape
// chain ([B, T] → [B, T, D] → [B, H, T, d_k] → [B, H, T, T] → … → [B, T, V]).
//
// The predicted chain (forward_chain.hpp) and the trace a running model records (models/) name
// their stages from this one list, so a prediction and a measurement can be compared by name.
#pragma once

#include <string_view>

namespace dissect::stage {

inline constexpr std::string_view token_ids = "token ids";
inline constexpr std::string_view embedding = "embedding";
inline constexpr std::string_view qkv_projection = "QKV projection";
inline constexpr std::string_view head_split = "head split";
inline constexpr std::string_view scores = "scores";
inline constexpr std::string_view softmax = "softmax";
inline constexpr std::string_view weighted_sum = "weighted sum";
inline constexpr std::string_view head_merge = "head merge + W_O";
/// A mixture of experts' router: logits [B, T, E], each token's top-k experts chosen from them.
inline constexpr std::string_view routing = "routing";
inline constexpr std::string_view ffn = "FFN";
inline constexpr std::string_view logits = "logits";
inline constexpr std::string_view sampling = "sampling";

}  // namespace dissect::stage
