// Codecs turn a chunk of fp32 values into the bytes that cross the WAN and
// back. They are stateless and thread safe; the error-feedback residual is
// owned by the caller (the sender keeps one per stream).
#pragma once

#include "fedwan/export.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fedwan {

// Wire identifiers: stable, never reused.
enum class CodecId : uint8_t { kFp32 = 1, kFp16 = 2, kBf16 = 3, kInt8 = 4 };

class FEDWAN_API Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecId id() const = 0;
  virtual std::string_view name() const = 0;

  // Exact payload size in bytes of n encoded elements.
  virtual size_t encoded_size(size_t n) const = 0;

  // Encodes n values into out (encoded_size(n) bytes). With a residual
  // (n floats, may be null) this is error feedback: it encodes in + residual
  // and leaves in the residual what the encoding lost, so that over rounds the
  // decoded sum tracks the true sum. Non-finite input throws fedwan::Error.
  virtual void encode(const float* in, size_t n, float* residual, uint8_t* out) const = 0;

  // True when `bytes` is exactly encoded_size(n) and every value it encodes
  // (and any scale) is finite. Receivers call this before decoding.
  virtual bool validate(const uint8_t* in, size_t bytes, size_t n) const = 0;

  // Decodes n values. Precondition: validate() returned true.
  virtual void decode(const uint8_t* in, size_t n, float* out) const = 0;

  // acc[i] = acc[i] + weight * decoded[i], the product rounded to fp32 before
  // the add (no fused multiply-add), so results equal decode() followed by
  // fedwan::accumulate_weighted bit for bit. Precondition: validate() true.
  virtual void decode_accumulate(const uint8_t* in, size_t n, float weight, float* acc) const = 0;

  // out[i] = base[i] + decoded[i]: a copy of base, then decode_accumulate
  // with weight 1, bit for bit (base may equal out; the two must not
  // otherwise overlap). The built-in fp16 and bf16 codecs do it in one pass;
  // this default copies first. Precondition: validate() returned true.
  virtual void decode_add(const uint8_t* in, size_t n, const float* base, float* out) const;

  // acc[i] = acc[i] + decoded[i] (decode_add in place, bit for bit), and
  // the same values into `copy`, stored past the caches: for a copy nobody
  // reads soon (a site's parameters, next read by the next training step).
  // acc and copy must not overlap. The built-in fp16 and bf16 codecs copy
  // each block while it is in L1; this default decodes the whole of it
  // first. Precondition: validate() returned true.
  virtual void decode_add_copy(const uint8_t* in, size_t n, float* acc, float* copy) const;
};

// Registry, keyed by name ("fp32", "fp16", "bf16", "int8") and by wire id.
// Lookups are thread safe once registration is over (built-ins are
// registered before main).
FEDWAN_API const Codec& codec_by_name(
    std::string_view name);                            // throws ConfigError naming the known codecs
FEDWAN_API const Codec* codec_by_id(CodecId id);       // nullptr when unknown
FEDWAN_API const Codec* codec_by_wire_id(uint8_t id);  // nullptr when unknown
FEDWAN_API std::vector<std::string> codec_names();
FEDWAN_API void register_codec(
    std::unique_ptr<Codec> codec);  // throws ConfigError on a duplicate name or id

// acc[i] = acc[i] + weight * x[i] (product rounded first; see decode_accumulate).
FEDWAN_API void accumulate_weighted(float* acc, const float* x, size_t n, float weight);

}  // namespace fedwan
