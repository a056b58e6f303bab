#include <gtest/gtest.h>
#include "dissect/linear_attention.hpp"
TEST(LinearAttentionPlaceholder, Builds) {}
