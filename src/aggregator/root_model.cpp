#include "aggregator/root_model.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/node_checkpoint.hpp"
#include "codec/block_scaled.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::aggregator {
namespace {

const uint8_t* bytes_of(const uint16_t* p) { return reinterpret_cast<const uint8_t*>(p); }
uint8_t* bytes_of(uint16_t* p) { return reinterpret_cast<uint8_t*>(p); }

// theta -= what the children will hold (held + step, by the arithmetic
// apply() uses: decode_accumulate with weight 1, the product exact); with
// `advances`, held becomes that value too.
void settle_values(float* theta, float* held, const float* step, size_t n, bool advances) {
  if (advances) {
    for (size_t i = 0; i < n; ++i) {
      const float next = held[i] + step[i];
      theta[i] -= next;
      held[i] = next;
    }
  } else {
    for (size_t i = 0; i < n; ++i) theta[i] -= held[i] + step[i];
  }
}

}  // namespace

RootModel::RootModel(std::vector<float> initial)
    : held_(std::move(initial)), residual_(held_.size()) {}

RootModel::RootModel(std::vector<float> held, ZeroedArray<uint16_t> residual)
    : held_(std::move(held)), residual_(std::move(residual)) {
  if (residual_.size() != held_.size()) {
    throw CryptoError("checkpoint: the root's residual holds " + std::to_string(residual_.size()) +
                      " values for a model of " + std::to_string(held_.size()));
  }
}

void RootModel::global_chunk(uint64_t off, uint32_t n, float* out) const {
  kernels::half_kernels().bf16_decode_add(bytes_of(residual_.data() + off), n, held_.data() + off,
                                          out);
}

void RootModel::settle_chunk(uint64_t off, uint32_t n, float* theta, const Codec& codec,
                             const uint8_t* payload, Anchor anchor) {
  // What the children will hold, without a copy of the held chunk.
  if (scratch_.size() < n) scratch_.resize(n);
  codec.decode(payload, n, scratch_.data());
  const bool advances = anchor == Anchor::kAdvances;
  if (advances) held_digest_.reset();
  settle_values(theta, held_.data() + off, scratch_.data(), n, advances);
  kernels::half_kernels().bf16_encode(theta, nullptr, n, bytes_of(residual_.data() + off));
}

void RootModel::encode_and_settle(uint64_t off, uint32_t n, float* theta, const Codec& codec,
                                  uint8_t* payload, std::vector<float>& diff, Anchor anchor) {
  if (codec.id() == CodecId::kFp16 && encode_fp16_and_settle(off, n, theta, payload, anchor)) {
    return;
  }
  const float* held = held_.data() + off;
  if (diff.size() < n) diff.resize(n);
  for (uint32_t k = 0; k < n; ++k) diff[k] = theta[k] - held[k];
  codec.encode(diff.data(), n, nullptr, payload);
  settle_chunk(off, n, theta, codec, payload, anchor);
}

bool RootModel::encode_fp16_and_settle(uint64_t off, uint32_t n, float* theta, uint8_t* payload,
                                       Anchor anchor) {
  const size_t blocks = Fp16Codec::blocks(n);
  if (fp16_measure(off, n, theta, payload, 0, blocks) >= kernels::kF32ExpMask) return false;
  settling_starts(anchor);
  fp16_settle(off, n, theta, payload, 0, blocks, anchor);
  return true;
}

uint32_t RootModel::fp16_measure(uint64_t off, uint32_t n, const float* theta, uint8_t* payload,
                                 size_t first_block, size_t end_block) const {
  constexpr size_t kBlock = Fp16Codec::kBlock;
  const kernels::HalfKernels& k = kernels::half_kernels();
  const float* const held = held_.data() + off;
  uint32_t top = 0;
  for (size_t b = first_block; b < end_block; ++b) {
    const size_t begin = b * kBlock;
    const size_t len = std::min(kBlock, size_t{n} - begin);
    const uint32_t max_bits = k.sub_max_abs_bits(theta + begin, held + begin, len);
    kernels::store_u32(payload + Fp16Codec::kScaleBytes * b, max_bits);
    top = std::max(top, max_bits);
  }
  return top;
}

void RootModel::settling_starts(Anchor anchor) {
  if (anchor == Anchor::kAdvances) held_digest_.reset();
}

void RootModel::fp16_settle(uint64_t off, uint32_t n, const float* theta, uint8_t* payload,
                            size_t first_block, size_t end_block, Anchor anchor) {
  constexpr size_t kBlock = Fp16Codec::kBlock;
  const kernels::HalfKernels& k = kernels::half_kernels();
  float* const held = held_.data() + off;
  uint8_t* const halves = payload + Fp16Codec::kScaleBytes * Fp16Codec::blocks(n);
  uint8_t* const residual = bytes_of(residual_.data() + off);
  const bool advances = anchor == Anchor::kAdvances;
  // Each block in one pass (what the children will hold, by apply()'s
  // arithmetic: see settle_chunk), the last first: the range is larger
  // than L2, and the measuring pass left its end there.
  for (size_t b = end_block; b-- > first_block;) {
    const size_t begin = b * kBlock;
    const size_t len = std::min(kBlock, size_t{n} - begin);
    uint8_t* const slot = payload + Fp16Codec::kScaleBytes * b;
    const kernels::Fp16Scale s = kernels::fp16_scale_for(kernels::load_u32(slot));
    kernels::store_scale(slot, s.scale);
    k.fp16_encode_settle(theta + begin, held + begin, len, s, advances, halves + 2 * begin,
                         residual + 2 * begin);
  }
}

const std::array<uint8_t, 32>& RootModel::held_digest() const {
  if (!held_digest_) held_digest_ = sha256(held_.data(), held_.size() * sizeof(float));
  return *held_digest_;
}

void RootModel::apply(uint64_t off, uint32_t n, const Codec& codec, const uint8_t* payload) {
  held_digest_.reset();
  codec.decode_accumulate(payload, n, 1.0f, held_.data() + off);
}

std::vector<float> RootModel::global() const {
  std::vector<float> g = held_;
  kernels::half_kernels().bf16_decode_accumulate(bytes_of(residual_.data()), residual_.size(), 1.0f,
                                                 g.data());
  return g;
}

std::vector<float> RootModel::take_global() {
  held_digest_.reset();
  kernels::half_kernels().bf16_decode_accumulate(bytes_of(residual_.data()), residual_.size(), 1.0f,
                                                 held_.data());
  residual_ = ZeroedArray<uint16_t>();
  return std::move(held_);
}

void RootModel::save(Checkpoint& c) const {
  c.sections.push_back(checkpoint::float_section("held", held_.data(), held_.size()));
  CheckpointSection r;
  r.name = "residual";
  r.view = bytes_of(residual_.data());
  r.view_size = residual_.size() * sizeof(uint16_t);
  c.sections.push_back(std::move(r));
}

RootModel RootModel::restore(const Checkpoint& c) {
  // Each array read from the file straight into its place.
  const CheckpointSection* r = c.find("residual");
  if (const CheckpointSection* h = c.find("held");
      r != nullptr && h != nullptr && r->size() != h->size() / sizeof(float) * sizeof(uint16_t)) {
    throw CryptoError("checkpoint: section 'residual' holds " + std::to_string(r->size()) +
                      " bytes for a model of " + std::to_string(h->size() / sizeof(float)));
  }
  std::vector<float> held = checkpoint::floats_of(c, "held", 0);
  ZeroedArray<uint16_t> residual(held.size());
  if (r != nullptr) {
    read_section(*r, bytes_of(residual.data()));
  } else {
    // Written before the residual: the global model beside the anchor.
    std::vector<float> global = checkpoint::floats_of(c, "global", held.size());
    for (size_t i = 0; i < global.size(); ++i) global[i] -= held[i];
    kernels::half_kernels().bf16_encode(global.data(), nullptr, global.size(),
                                        bytes_of(residual.data()));
  }
  return RootModel(std::move(held), std::move(residual));
}

}  // namespace fedwan::aggregator
