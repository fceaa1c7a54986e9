// Fuzzes every registered codec the way a receiver uses it: validate() on
// the payload a peer sent, then, only when it says yes, decode() and
// decode_accumulate() into buffers of exactly n floats (ASan reports any
// byte read or written past them).
//
// Input: u64 LE element count n | f32 LE weight | payload.
// Each codec is tried with that n (any value, including ones whose encoded
// size overflows) and with the n whose encoded size is exactly the payload,
// when there is one, so most inputs also reach the decoders.
//
// Checked promises (include/fedwan/codec.hpp): validate() true means every
// decoded value is finite, and decode_accumulate() equals decode() followed
// by accumulate_weighted() bit for bit; where the update screen measures a
// payload without decoding it (aggregation::measure_payload), its measure is
// that of the decoded values, bit for bit.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "aggregation/update_screen.hpp"
#include "fedwan/codec.hpp"

namespace {

constexpr size_t kPrefix = 12;

[[noreturn]] void fail(const fedwan::Codec& codec, size_t n, const char* what) {
  std::fprintf(stderr, "fuzz_codec: %s, n=%zu: %s\n", std::string(codec.name()).c_str(), n, what);
  std::abort();
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The n with encoded_size(n) == bytes, if any. encoded_size is
// non-decreasing and, for any codec worth the name, at least one bit per
// element, so the answer lies in [0, 8 * bytes].
bool fitting_count(const fedwan::Codec& codec, size_t bytes, size_t* n) {
  size_t lo = 0, hi = 8 * bytes;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (codec.encoded_size(mid) < bytes) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *n = lo;
  return codec.encoded_size(lo) == bytes;
}

void exercise(const fedwan::Codec& codec, const uint8_t* payload, size_t bytes, size_t n,
              float weight) {
  if (!codec.validate(payload, bytes, n)) return;
  // validate() accepted exactly encoded_size(n) bytes, so n is bounded by
  // the input size and these allocations are small.
  std::vector<float> decoded(n);
  codec.decode(payload, n, decoded.data());
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(decoded[i])) fail(codec, n, "validate() passed a non-finite value");
  }

  if (const auto m = fedwan::aggregation::measure_payload(codec, payload, n)) {
    const fedwan::aggregation::ValueMeasure want =
        fedwan::aggregation::measure_values(decoded.data(), n);
    if (std::memcmp(&m->squares, &want.squares, sizeof want.squares) != 0 || m->top != want.top) {
      fail(codec, n, "measure_payload differs from measure_values of the decoding");
    }
  }

  // The accumulator starts from a spread of magnitudes and signs, as a
  // running sum would.
  std::vector<float> acc(n), expected(n);
  for (size_t i = 0; i < n; ++i) {
    acc[i] = expected[i] =
        std::ldexp(static_cast<float>(i % 7) - 3.0f, static_cast<int>(i % 41) - 20);
  }
  codec.decode_accumulate(payload, n, weight, acc.data());
  fedwan::accumulate_weighted(expected.data(), decoded.data(), n, weight);
  for (size_t i = 0; i < n; ++i) {
    const bool both_nan = std::isnan(acc[i]) && std::isnan(expected[i]);
    if (!both_nan && bits(acc[i]) != bits(expected[i])) {
      fail(codec, n, "decode_accumulate differs from decode + accumulate_weighted");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kPrefix) return 0;
  uint64_t raw_n = 0;
  for (int i = 7; i >= 0; --i) raw_n = (raw_n << 8) | data[i];
  float weight;
  std::memcpy(&weight, data + 8, sizeof weight);
  // Receivers pass a frame weight that parse_frame found finite.
  if (!std::isfinite(weight)) weight = 1.0f;
  const uint8_t* payload = data + kPrefix;
  const size_t bytes = size - kPrefix;

  static const std::vector<const fedwan::Codec*> codecs = [] {
    std::vector<const fedwan::Codec*> all;
    for (const std::string& name : fedwan::codec_names())
      all.push_back(&fedwan::codec_by_name(name));
    return all;
  }();
  for (const fedwan::Codec* c : codecs) {
    const fedwan::Codec& codec = *c;
    if (raw_n <= SIZE_MAX) exercise(codec, payload, bytes, static_cast<size_t>(raw_n), weight);
    size_t fit = 0;
    if (fitting_count(codec, bytes, &fit) && fit != raw_n) {
      exercise(codec, payload, bytes, fit, weight);
    }
  }
  return 0;
}
