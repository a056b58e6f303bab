// dissect/io/half.hpp — moved to dissect/numeric/half.hpp (fp16/bf16 conversion is numeric code
// that the kernels use too, not I/O). This forwarding header stays for one release.
#pragma once

#include "dissect/numeric/half.hpp"
