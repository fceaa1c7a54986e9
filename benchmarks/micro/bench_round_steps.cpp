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
//   BM_Site_UpdateTwoPasses   a site's update (anchor - params) into a
//                             chunk buffer, then encoded with its bf16
//                             residual a block at a time in two passes
//                             (every block's maximum first, nothing written
//                             before all are known finite)
//   BM_Site_UpdateOnePass     codec::encode_difference_with_bf16_residual:
//                             the same bits, each block's difference made,
//                             measured and encoded while in L1, its old
//                             residual bits saved to undo a non-finite value
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
#include "codec/block_scaled.hpp"
#include "codec/compact_feedback.hpp"
#include "codec/fp16_codec.hpp"
#include "codec/half.hpp"
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

// The site's encoding as it was: the difference stored whole, then two
// passes over it and the residual, a block at a time.
void two_pass_update(const float* anchor, const float* params, uint32_t n, float* delta,
                     uint16_t* residual, uint8_t* out) {
  namespace k = fedwan::kernels;
  using fedwan::Fp16Codec;
  constexpr size_t kBlock = Fp16Codec::kBlock;
  const k::HalfKernels& h = k::half_kernels();
  for (uint32_t i = 0; i < n; ++i) delta[i] = anchor[i] - params[i];
  auto* bits = reinterpret_cast<uint8_t*>(residual);
  uint8_t* const halves = out + Fp16Codec::kScaleBytes * Fp16Codec::blocks(n);
  alignas(64) float r[kBlock];
  k::for_each_block<kBlock>(size_t{n}, [&](size_t b, size_t begin, size_t len) {
    h.bf16_decode(bits + 2 * begin, len, r);
    k::store_u32(out + Fp16Codec::kScaleBytes * b, h.max_abs_bits(delta + begin, r, len));
  });
  k::for_each_block<kBlock>(size_t{n}, [&](size_t b, size_t begin, size_t len) {
    const k::Fp16Scale s = k::fp16_scale_for(k::load_u32(out + Fp16Codec::kScaleBytes * b));
    k::store_scale(out + Fp16Codec::kScaleBytes * b, s.scale);
    h.bf16_decode(bits + 2 * begin, len, r);
    h.fp16_encode(delta + begin, r, len, s, halves + 2 * begin);
    h.bf16_encode(r, nullptr, len, bits + 2 * begin);
  });
}

void site_update(benchmark::State& state, bool one_pass) {
  const Codec& fp16 = codec_by_name("fp16");
  const std::vector<float> anchor = ramp(kElements, 0.25f, 0.0003f);
  std::vector<float> params = anchor;
  for (size_t k = 0; k < kElements; k += 5) params[k] += 1e-4f;  // the local steps
  std::vector<uint16_t> residual(kElements, 0);
  std::vector<float> delta(kChunk), scratch, diff;
  std::vector<uint8_t> payload(fp16.encoded_size(kChunk));
  for (auto _ : state) {
    for (size_t off = 0; off < kElements; off += kChunk) {
      if (one_pass) {
        fedwan::codec::encode_difference_with_bf16_residual(
            fp16, anchor.data() + off, params.data() + off, kChunk, residual.data() + off, scratch,
            diff, payload.data());
      } else {
        two_pass_update(anchor.data() + off, params.data() + off, kChunk, delta.data(),
                        residual.data() + off, payload.data());
      }
      benchmark::DoNotOptimize(payload.data());
    }
  }
  finish(state);
}

void BM_Site_UpdateTwoPasses(benchmark::State& state) { site_update(state, false); }
void BM_Site_UpdateOnePass(benchmark::State& state) { site_update(state, true); }

// With `fresh`, state.range(0) 1 gives add() each payload's measure, as the
// crypto thread that opened the frame gives it (aggregator/delta_inspection.hpp):
// what is left to the event loop.
void root_copies(benchmark::State& state, bool recycle, bool fresh = false) {
  // As the node programs keep freed heap (cli/node_common.cpp).
  ::mallopt(M_MMAP_THRESHOLD, 2 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 4 << 20);
  constexpr uint32_t kCopyChunk = uint32_t{1} << 18;
  const Codec& fp16 = codec_by_name("fp16");
  const fedwan::tensor::ChunkPlan plan(kElements, kCopyChunk);
  fedwan::aggregation::RoundAccumulator acc(plan, {10, 11});
  const bool parked = !fresh && state.range(0) != 0;
  const bool measured = fresh && state.range(0) != 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  if (parked) acc.park_beyond(0, dir.string(), "bench");
  // Two children's copies of a chunk, as opened from the link: the same
  // two for every chunk (in cache), or with `fresh` each chunk's own, as a
  // round brings them (from memory).
  const size_t kinds = fresh ? 2 * size_t{plan.count()} : 2;
  std::vector<std::vector<uint8_t>> payloads(kinds,
                                             std::vector<uint8_t>(fp16.encoded_size(kCopyChunk)));
  for (size_t s = 0; s < kinds; ++s) {
    const std::vector<float> v =
        ramp(kCopyChunk, -0.01f * float(s % 2 + 1) - 1e-4f * float(s / 2), 2e-5f);
    fp16.encode(v.data(), kCopyChunk, nullptr, payloads[s].data());
  }
  // Larger than the last level cache: what one chunk leaves in it is gone
  // before the next round comes back to it.
  std::vector<uint8_t> evict(fresh ? size_t{64} << 20 : 0);
  std::vector<fedwan::aggregation::PayloadFacts> facts(kinds);
  for (size_t k = 0; k < kinds && measured; ++k) {
    facts[k].valid = true;
    facts[k].measure = fedwan::aggregation::measure_payload(fp16, payloads[k].data(), kCopyChunk);
  }
  uint64_t round = 1;
  for (auto _ : state) {
    acc.open(round);
    for (uint32_t c = 0; c < plan.count(); ++c) {
      for (uint32_t s = 0; s < 2; ++s) {
        const size_t k = fresh ? 2 * c + s : s;
        const std::vector<uint8_t>& p = payloads[k];
        const auto r =
            acc.add(round, 10 + s, c, kCopyChunk, 1.0 + s, fp16, p.data(), p.size(), 0, facts[k]);
        if (!r.chunk_complete) continue;
        fedwan::aggregation::ChunkSum sum = acc.take(c);
        benchmark::DoNotOptimize(sum.mean.data());
        if (recycle) acc.recycle(std::move(sum.mean));
      }
    }
    round += 1;
    if (fresh) {
      state.PauseTiming();
      for (size_t i = 0; i < evict.size(); i += 64) evict[i] += 1;
      benchmark::DoNotOptimize(evict.data());
      state.ResumeTiming();
    }
  }
  finish(state);
}

// The screen's measure of one chunk's fp16 copy in cache, as the crypto
// thread takes it after opening the frame: from the payload a block at a
// time (0), or decoded whole into a buffer and measured there (1).
void BM_Screen_Measure(benchmark::State& state) {
  constexpr uint32_t kCopyChunk = uint32_t{1} << 18;
  const Codec& fp16 = codec_by_name("fp16");
  std::vector<uint8_t> payload(fp16.encoded_size(kCopyChunk));
  const std::vector<float> v = ramp(kCopyChunk, -0.01f, 2e-5f);
  fp16.encode(v.data(), kCopyChunk, nullptr, payload.data());
  std::vector<float> values(kCopyChunk);
  for (auto _ : state) {
    fedwan::aggregation::ValueMeasure m;
    if (state.range(0) == 0) {
      m = *fedwan::aggregation::measure_payload(fp16, payload.data(), kCopyChunk);
    } else {
      fp16.decode(payload.data(), kCopyChunk, values.data());
      m = fedwan::aggregation::measure_values(values.data(), kCopyChunk);
    }
    benchmark::DoNotOptimize(m);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kCopyChunk * sizeof(float)));
}

void BM_Root_CopiesIntoNewSums(benchmark::State& state) { root_copies(state, false); }
void BM_Root_CopiesIntoUsedSums(benchmark::State& state) { root_copies(state, true); }
void BM_Root_CopiesFromMemory(benchmark::State& state) { root_copies(state, true, true); }

}  // namespace

BENCHMARK(BM_Root_CopiesIntoNewSums)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_CopiesIntoUsedSums)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Screen_Measure)->Arg(0)->Arg(1);
BENCHMARK(BM_Root_CopiesFromMemory)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_AnchorAtCommit)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_AnchorAdvancing)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_EncodeThenSettle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Root_EncodeAndSettle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_AnchorThenCopy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_AnchorInPlace)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_AnchorStreamed)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_UpdateTwoPasses)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Site_UpdateOnePass)->Unit(benchmark::kMillisecond);
