// The root's model in one fp32 copy. The anchor every child holds (`held`)
// is kept exactly, in fp32: it is what the children decoded, bit for bit,
// and what a rejoining child is sent. The global model the outer optimizer
// steps is that anchor plus a residual: what the down-path encoding has not
// delivered yet (fp16 rounding, int8 steps, the last bits of an fp32 sum).
// The residual is kept in bf16: it is a few units in the last place of the
// anchor's encoding, so bf16's 8 bits of it are far below the global
// model's own fp32 resolution, and bf16 keeps fp32's range (fp16 would
// flush residuals under 6e-8 to zero). So the root holds 1.5 copies of the
// model, not two. Not thread safe: the aggregator's event loop owns it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "common/zeroed_array.hpp"
#include "fedwan/codec.hpp"

namespace fedwan::aggregator {

class RootModel {
 public:
  RootModel() = default;
  // Starts with the global model equal to the anchor (residual 0, its
  // pages taken as the first rounds write them).
  explicit RootModel(std::vector<float> initial);
  // From a checkpoint: the anchor, and the residual's bf16 bits.
  RootModel(std::vector<float> held, ZeroedArray<uint16_t> residual);

  size_t size() const { return held_.size(); }
  // Takes the residual's pages on a helper thread, ahead of the first
  // round's writes.
  void warm() { residual_.warm(); }
  const std::vector<float>& held() const { return held_; }
  // SHA-256 of the anchor's fp32 bytes (what a child's hello names): taken
  // once for each anchor, when first asked, and kept until apply() moves it.
  const std::array<uint8_t, 32>& held_digest() const;
  // That digest as the checkpoint save() viewed took it (its "held"
  // section's), for an anchor that has not moved since.
  void adopt_held_digest(const std::array<uint8_t, 32>& digest) { held_digest_ = digest; }
  // The anchor's digest where it is known without hashing (taken since the
  // anchor last moved, or adopted).
  const std::optional<std::array<uint8_t, 32>>& known_held_digest() const { return held_digest_; }

  // Whether settle_chunk and encode_and_settle move the anchor too.
  enum class Anchor {
    kStays,     // it moves later, in apply()
    kAdvances,  // by what the children decode, in the same pass
  };

  // out[0..n) = the global model's values at [off, off + n).
  void global_chunk(uint64_t off, uint32_t n, float* out) const;
  // The chunk at `off` stepped to `theta` (its new global values), and
  // `payload` (the anchor update as `codec` encoded it) on its way down:
  // keeps theta minus what the children will hold as the residual. The
  // anchor itself moves in apply(), or here with Anchor::kAdvances (the
  // same values, bit for bit); `theta` is overwritten.
  void settle_chunk(uint64_t off, uint32_t n, float* theta, const Codec& codec,
                    const uint8_t* payload, Anchor anchor = Anchor::kStays);
  // Both steps of a chunk's round at once: encodes the anchor update
  // (theta - held) with `codec` into `payload` (codec.encoded_size(n)
  // bytes) and settles the chunk as settle_chunk does. The fp16 codec's
  // blocks are encoded and settled in one pass over each
  // (HalfKernels::fp16_encode_settle: the same arithmetic per element as
  // encode then settle_chunk, so the same bits); other codecs go through
  // `diff` (grown to n floats). `theta` is the caller's scratch: what it
  // holds after is unspecified. Throws as the codec's encode does, on a
  // value it cannot encode, with the residual untouched.
  void encode_and_settle(uint64_t off, uint32_t n, float* theta, const Codec& codec,
                         uint8_t* payload, std::vector<float>& diff,
                         Anchor anchor = Anchor::kStays);
  // The fp16 codec's part of encode_and_settle in its two passes, over a
  // range of the chunk's blocks (Fp16Codec::kBlock values each) at a time,
  // so that a chunk can be split over threads. First fp16_measure over
  // every block: it parks each block's largest |theta - held| in the
  // block's scale slot and returns the range's largest (>=
  // kernels::kF32ExpMask: a value is not finite, and nothing may be
  // settled: encode_and_settle then names it and throws). Then
  // settling_starts, on one thread, and fp16_settle over every block.
  // Disjoint ranges of one chunk may be measured, or settled, on several
  // threads at once, with nothing else of the model running meanwhile.
  // The same bits as encode_and_settle.
  uint32_t fp16_measure(uint64_t off, uint32_t n, const float* theta, uint8_t* payload,
                        size_t first_block, size_t end_block) const;
  void settling_starts(Anchor anchor);
  void fp16_settle(uint64_t off, uint32_t n, const float* theta, uint8_t* payload,
                   size_t first_block, size_t end_block, Anchor anchor);
  // The anchor moves by the update the children decode (the same
  // arithmetic settle_chunk assumed, so held + residual is the global model
  // again).
  void apply(uint64_t off, uint32_t n, const Codec& codec, const uint8_t* payload);

  // The whole global model, as a new vector.
  std::vector<float> global() const;
  // The whole global model, made in place of the anchor; the model is empty
  // after.
  std::vector<float> take_global();

  // Checkpoint sections viewing this model ("held", "residual"): valid
  // until it changes.
  void save(Checkpoint& c) const;
  // From a checkpoint's sections: "held" and "residual", or a checkpoint
  // written before the residual ("held" and "global"). Throws CryptoError
  // when they are missing or their sizes disagree.
  static RootModel restore(const Checkpoint& c);

 private:
  // encode_and_settle for the fp16 codec; false, with only the payload's
  // scale slots written, when a value is not finite.
  bool encode_fp16_and_settle(uint64_t off, uint32_t n, float* theta, uint8_t* payload,
                              Anchor anchor);

  std::vector<float> held_;
  ZeroedArray<uint16_t> residual_;  // bf16 bits, little-endian in checkpoints
  std::vector<float> scratch_;      // one chunk's decoded anchor step (settle_chunk)
  mutable std::optional<std::array<uint8_t, 32>> held_digest_;  // of held_, while it stands
};

}  // namespace fedwan::aggregator
