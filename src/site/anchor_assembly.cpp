#include "site/anchor_assembly.hpp"

#include <utility>

namespace fedwan::site {

void AnchorAssembly::expect_full(uint64_t round) {
  full_.emplace();
  full_->round = round;
  full_->got.assign(chunks_, false);
}

void AnchorAssembly::expect_next(uint64_t round) {
  if (next_ && next_->round == round) return;
  next_.emplace();
  next_->round = round;
  next_->got.assign(chunks_, false);
  early_.clear();
}

AnchorAssembly::Taken AnchorAssembly::take(uint64_t chunk_round, uint32_t chunk, bool full,
                                           uint64_t round, uint32_t encoded_upto, uint8_t codec,
                                           const uint8_t* payload, size_t payload_size,
                                           Clock::time_point now) {
  Taken t;
  if (chunk >= chunks_) return t;
  if (full) {
    if (!full_ || chunk_round != full_->round || full_->got[chunk]) return t;
    full_->got[chunk] = true;
    t.step = ++full_->received < chunks_ ? Step::kFull : Step::kFullComplete;
    return t;
  }
  if (!next_ && chunk_round == round + 1 && !full_) {
    // Before this site's sync (it rejoined mid-round, or the round closed
    // without it): kept until its deltas are computed.
    expect_next(round + 1);
    t.opened = true;
    encoded_upto = 0;
  }
  if (!next_ || chunk_round != next_->round || next_->got[chunk]) return t;
  next_->got[chunk] = true;
  next_->received += 1;
  progress_at_ = now;
  if (chunk >= encoded_upto) {
    early_.push_back({chunk, codec, std::vector<uint8_t>(payload, payload + payload_size)});
    t.step = Step::kEarly;
  } else {
    t.step = Step::kApply;
  }
  return t;
}

std::vector<AnchorAssembly::EarlyChunk> AnchorAssembly::take_early(uint32_t encoded_upto) {
  std::vector<EarlyChunk> ready;
  std::vector<EarlyChunk> later;
  for (EarlyChunk& c : early_) {
    (c.chunk < encoded_upto ? ready : later).push_back(std::move(c));
  }
  early_ = std::move(later);
  return ready;
}

}  // namespace fedwan::site
