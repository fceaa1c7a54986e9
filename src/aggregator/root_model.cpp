#include "aggregator/root_model.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/node_checkpoint.hpp"
#include "codec/half.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::aggregator {
namespace {

const uint8_t* bytes_of(const uint16_t* p) { return reinterpret_cast<const uint8_t*>(p); }
uint8_t* bytes_of(uint16_t* p) { return reinterpret_cast<uint8_t*>(p); }

}  // namespace

RootModel::RootModel(std::vector<float> initial)
    : held_(std::move(initial)), residual_(held_.size(), 0) {}

RootModel::RootModel(std::vector<float> held, std::vector<uint16_t> residual)
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
                             const uint8_t* payload) {
  // What the children will hold, by the arithmetic apply() uses
  // (decode_accumulate with weight 1: held + the decoded value, the product
  // exact), without a copy of the held chunk.
  if (scratch_.size() < n) scratch_.resize(n);
  codec.decode(payload, n, scratch_.data());
  const float* held = held_.data() + off;
  const float* step = scratch_.data();
  for (uint32_t k = 0; k < n; ++k) theta[k] -= held[k] + step[k];
  kernels::half_kernels().bf16_encode(theta, nullptr, n, bytes_of(residual_.data() + off));
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
  std::vector<uint16_t>().swap(residual_);
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
  std::vector<float> held = checkpoint::floats_of(c, "held", 0);
  std::vector<uint16_t> residual(held.size());
  if (const CheckpointSection* s = c.find("residual")) {
    if (s->size() != residual.size() * sizeof(uint16_t)) {
      throw CryptoError("checkpoint: section 'residual' holds " + std::to_string(s->size()) +
                        " bytes for a model of " + std::to_string(held.size()));
    }
    std::copy_n(s->data(), s->size(), bytes_of(residual.data()));
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
