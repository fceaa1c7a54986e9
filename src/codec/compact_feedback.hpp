// Error feedback whose residual is kept in bf16: half the memory of an fp32
// residual, with fp32's range (fp16 would flush residuals under 6e-8 to
// zero). The residual is a few units in the last place of what the codec
// sends; bf16 keeps it to 2^-9 of itself, far below the codec's own error.
// A region keeps its up-path residual so (aggregator/region_role.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fedwan/codec.hpp"

namespace fedwan::codec {

// Encodes n values with `codec`, the residual added and updated as
// Codec::encode does: `residual` holds n bf16 values (their bits, as
// kernels::HalfKernels writes them). `scratch` is a working buffer, grown
// to n floats (half of that with the fp16 codec, which saves the residual's
// bits there as it goes: a non-finite value leaves the residual as it was).
void encode_with_bf16_residual(const Codec& codec, const float* values, size_t n,
                               uint16_t* residual, std::vector<float>& scratch, uint8_t* out);

// The same for values[i] = minuend[i] - subtrahend[i] (a site's update:
// anchor minus parameters), the same bits. With the fp16 codec the
// difference is made a block at a time in L1 and never stored whole; other
// codecs make it in `diff` (grown to n floats) first.
void encode_difference_with_bf16_residual(const Codec& codec, const float* minuend,
                                          const float* subtrahend, size_t n, uint16_t* residual,
                                          std::vector<float>& scratch, std::vector<float>& diff,
                                          uint8_t* out);

}  // namespace fedwan::codec
