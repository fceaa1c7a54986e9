// The steps a round takes over the whole model at the root and at a site
// besides the link, each beside the way it was done before, over a model of
// 32M elements (128 MiB of fp32, beyond the caches as a real model is) in
// 1M-element chunks, fp16:
//   BM_Root_EncodeThenSettle  the anchor update (theta - held) into a
//                             buffer, encoded, decoded again, settled into
//                             the residual: a pass over the chunk each
//   BM_Root_EncodeAndSettle   RootModel::encode_and_settle: the same bits,
//                             block by block while each is in L1
//   BM_Site_AnchorThenCopy    each anchor chunk decoded onto the anchor into
//                             params, then the whole params copied into the
//                             anchor at the round's end
//   BM_Site_AnchorInPlace     each chunk decoded into the anchor in place and
//                             copied into params while in cache
//   BM_Site_AnchorStreamed    Codec::decode_add_copy: each block decoded
//                             into the anchor and copied into params while
//                             in L1, the copy stored past the caches
//   BM_Root_CopiesIntoNewSums two children's copies of every chunk into the
//                             round's accumulator, one after the other,
//                             each chunk taken once both are in: each
//                             chunk's sum a new zeroed vector
//   BM_Root_CopiesIntoUsedSums the same, every taken chunk's values handed
//                             back (RoundAccumulator::recycle) and the next
//                             sum written into them
//   BM_Root_AnchorAtCommit    encode and settle each chunk (anchor staying),
//                             its frame appended to a spill file; at the
//                             commit each frame read back and added to the
//                             anchor (RootModel::apply)
//   BM_Root_AnchorAdvancing   the same with the anchor moved in the encode
//                             and settle pass (Anchor::kAdvances): the frames
//                             still go to the file (for children whose
//                             windows lag), none is read back
//   (in 256K-element chunks, the topology's default, with the node
//   programs' heap settings; /1: every first copy waits on disk as its payload, as at a root whose
//   chunks in flight are over its budget, and is rebuilt when the second
//   comes)
// Both EncodeThen/EncodeAnd benchmarks first make theta from the held anchor and the
// residual (RootModel::global_chunk), as the root does. Bytes processed are
// the model's fp32 bytes. Run them interleaved with repetitions
// (--benchmark_enable_random_interleaving=true --benchmark_repetitions=6)
// on a machine whose speed moves.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "aggregator/root_model.hpp"
#include "common/spill_file.hpp"
#include "fedwan/codec.hpp"
#include "tensor/chunk_plan.hpp"

namespace {

using fedwan::Codec;
using fedwan::codec_by_name;

constexpr size_t kElements = size_t{32} << 20;
constexpr uint32_t kChunk = uint32_t{1} << 20;

std::vector<float> ramp(size_t n, float base, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i % 1009);
  return v;
}

void finish(benchmark::State& state) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kElements * sizeof(float)));
}

void root_round(benchmark::State& state, bool fused) {
  const Codec& fp16 = codec_by_name("fp16");
  fedwan::aggregator::RootModel m(ramp(kElements, -0.5f, 0.001f));
  std::vector<float> theta(kChunk), diff(kChunk);
  std::vector<uint8_t> payload(fp16.encoded_size(kChunk));
  for (auto _ : state) {
    for (size_t off = 0; off < kElements; off += kChunk) {
      m.global_chunk(off, kChunk, theta.data());
      for (uint32_t k = 0; k < kChunk; k += 7) theta[k] += 1e-4f;  // a step
      if (fused) {
        m.encode_and_settle(off, kChunk, theta.data(), fp16, payload.data(), diff);
      } else {
        const float* held = m.held().data() + off;
        for (uint32_t k = 0; k < kChunk; ++k) diff[k] = theta[k] - held[k];
        fp16.encode(diff.data(), kChunk, nullptr, payload.data());
        m.settle_chunk(off, kChunk, theta.data(), fp16, payload.data());
      }
      benchmark::DoNotOptimize(payload.data());
    }
  }
  finish(state);
}

void root_commit(benchmark::State& state, bool advancing) {
  using fedwan::aggregator::RootModel;
  const Codec& fp16 = codec_by_name("fp16");
  RootModel m(ramp(kElements, -0.5f, 0.001f));
  std::vector<float> theta(kChunk), diff(kChunk);
  std::vector<uint8_t> payload(fp16.encoded_size(kChunk));
  std::vector<uint8_t> back(payload.size());
  std::string why;
  fedwan::SpillFiles files;
  for (auto _ : state) {
    std::shared_ptr<fedwan::SpillFile> file = files.next("", &why);
    if (!file) {
      state.SkipWithError(why.c_str());
      return;
    }
    std::vector<uint64_t> at;
    for (size_t off = 0; off < kElements; off += kChunk) {
      m.global_chunk(off, kChunk, theta.data());
      for (uint32_t k = 0; k < kChunk; k += 7) theta[k] += 1e-4f;  // a step
      m.encode_and_settle(off, kChunk, theta.data(), fp16, payload.data(), diff,
                          advancing ? RootModel::Anchor::kAdvances : RootModel::Anchor::kStays);
      uint64_t where = 0;
      if (!file->append(payload.data(), payload.size(), &where)) {
        state.SkipWithError("spill file: write failed");
        return;
      }
      at.push_back(where);
    }
    if (!advancing) {
      for (size_t i = 0, off = 0; off < kElements; ++i, off += kChunk) {
        file->read(at[i], back.data(), back.size());
        m.apply(off, kChunk, fp16, back.data());
      }
    }
    benchmark::DoNotOptimize(m.held().data());
    files.retire(std::move(file));
  }
  finish(state);
}

void BM_Root_AnchorAtCommit(benchmark::State& state) { root_commit(state, false); }
void BM_Root_AnchorAdvancing(benchmark::State& state) { root_commit(state, true); }

void BM_Root_EncodeThenSettle(benchmark::State& state) { root_round(state, false); }
void BM_Root_EncodeAndSettle(benchmark::State& state) { root_round(state, true); }

enum class SiteAnchor { kThenCopy, kInPlace, kStreamed };

void site_anchor(benchmark::State& state, SiteAnchor how) {
  const Codec& fp16 = codec_by_name("fp16");
  std::vector<float> anchor = ramp(kElements, 0.25f, 0.0003f);
  std::vector<float> params = anchor;
  std::vector<float> step(kChunk);
  for (uint32_t k = 0; k < kChunk; ++k) step[k] = 1e-6f * std::sin(static_cast<float>(k));
  // One chunk's payload, as opened from the link: in cache when decoded.
  std::vector<uint8_t> payload(fp16.encoded_size(kChunk));
  fp16.encode(step.data(), kChunk, nullptr, payload.data());
  for (auto _ : state) {
    for (size_t off = 0; off < kElements; off += kChunk) {
      float* a = anchor.data() + off;
      if (how == SiteAnchor::kInPlace) {
        fp16.decode_add(payload.data(), kChunk, a, a);
        std::memcpy(params.data() + off, a, size_t{kChunk} * sizeof(float));
      } else if (how == SiteAnchor::kStreamed) {
        fp16.decode_add_copy(payload.data(), kChunk, a, params.data() + off);
      } else {
        fp16.decode_add(payload.data(), kChunk, a, params.data() + off);
      }
    }
    if (how == SiteAnchor::kThenCopy) {
      std::memcpy(anchor.data(), params.data(), kElements * sizeof(float));
    }
    benchmark::DoNotOptimize(params.data());
  }
  finish(state);
}

void BM_Site_AnchorThenCopy(benchmark::State& state) { site_anchor(state, SiteAnchor::kThenCopy); }
void BM_Site_AnchorInPlace(benchmark::State& state) { site_anchor(state, SiteAnchor::kInPlace); }
void BM_Site_AnchorStreamed(benchmark::State& state) { site_anchor(state, SiteAnchor::kStreamed); }

void root_copies(benchmark::State& state, bool recycle) {
  // As the node programs keep freed heap (cli/node_common.cpp).
  ::mallopt(M_MMAP_THRESHOLD, 2 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 4 << 20);
  constexpr uint32_t kCopyChunk = uint32_t{1} << 18;
  const Codec& fp16 = codec_by_name("fp16");
  const fedwan::tensor::ChunkPlan plan(kElements, kCopyChunk);
  fedwan::aggregation::RoundAccumulator acc(plan, {10, 11});
  const bool parked = state.range(0) != 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  if (parked) acc.park_beyond(0, dir.string(), "bench");
  // Two children's copies of a chunk, as opened from the link.
  std::vector<std::vector<uint8_t>> payloads(2,
                                             std::vector<uint8_t>(fp16.encoded_size(kCopyChunk)));
  for (size_t s = 0; s < 2; ++s) {
    const std::vector<float> v = ramp(kCopyChunk, -0.01f * float(s + 1), 2e-5f);
    fp16.encode(v.data(), kCopyChunk, nullptr, payloads[s].data());
  }
  uint64_t round = 1;
  for (auto _ : state) {
    acc.open(round);
    for (uint32_t c = 0; c < plan.count(); ++c) {
      for (uint32_t s = 0; s < 2; ++s) {
        const auto r = acc.add(round, 10 + s, c, kCopyChunk, 1.0 + s, fp16, payloads[s].data(),
                               payloads[s].size());
        if (!r.chunk_complete) continue;
        fedwan::aggregation::ChunkSum sum = acc.take(c);
        benchmark::DoNotOptimize(sum.mean.data());
        if (recycle) acc.recycle(std::move(sum.mean));
      }
    }
    round += 1;
  }
  finish(state);
}

void BM_Root_CopiesIntoNewSums(benchmark::State& state) { root_copies(state, false); }
void BM_Root_CopiesIntoUsedSums(benchmark::State& state) { root_copies(state, true); }

}  // namespace

BENCHMARK(BM_Root_CopiesIntoNewSums)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_CopiesIntoUsedSums)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_AnchorAtCommit)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_AnchorAdvancing)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_EncodeThenSettle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_EncodeAndSettle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_AnchorThenCopy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_AnchorInPlace)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_AnchorStreamed)->Unit(benchmark::kMillisecond);
