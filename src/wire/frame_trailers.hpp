// What frame.cpp and frame_trailers.cpp share: a parse's refusal, and the
// trailers some data and welcome frames end their payload with
// (wire/frame.hpp: kFlagExcused, kFlagUnclipped, kFlagClip).
#pragma once

#include <cstdint>

#include "wire/frame.hpp"

namespace fedwan::wire::detail {

// Marks `f` refused for `r` with a printf-style detail and hides its payload.
__attribute__((format(printf, 3, 4))) ParsedFrame& reject(ParsedFrame& f, RejectReason r,
                                                          const char* fmt, ...);

// Reads and checks the trailers at the end of `payload` (the header's
// payload_length bytes, at least trailer_size(header)) into `f`.
ParsedFrame& read_trailers(ParsedFrame& f, const uint8_t* payload);

}  // namespace fedwan::wire::detail
