// Codec throughput against memcpy of the same fp32 chunk, measured in the
// same run (see report.py for the ratios). Bytes processed are always the
// chunk's fp32 bytes, so every bytes_per_second is directly comparable.
// Names follow BM_<group>_<what>/<chunk bytes>; report.py relies on that.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "fedwan/codec.hpp"

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A pseudo-gradient-like chunk: small values around zero.
std::vector<float> delta_chunk(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

size_t elements(const benchmark::State& state) { return size_t(state.range(0)) / sizeof(float); }

void finish(benchmark::State& state) {
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}

void BM_Codec_Memcpy(benchmark::State& state) {
  const size_t n = elements(state);
  const std::vector<float> src = delta_chunk(n, 1);
  std::vector<float> dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void run_encode(benchmark::State& state, const char* codec, bool error_feedback) {
  const fedwan::Codec& c = fedwan::codec_by_name(codec);
  const size_t n = elements(state);
  const std::vector<float> in = delta_chunk(n, 2);
  std::vector<float> residual(n, 0.0f);
  std::vector<uint8_t> out(c.encoded_size(n));
  for (auto _ : state) {
    c.encode(in.data(), n, error_feedback ? residual.data() : nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

std::vector<uint8_t> encoded(const fedwan::Codec& c, size_t n) {
  std::vector<uint8_t> out(c.encoded_size(n));
  const std::vector<float> in = delta_chunk(n, 3);
  c.encode(in.data(), n, nullptr, out.data());
  return out;
}

void run_decode(benchmark::State& state, const char* codec) {
  const fedwan::Codec& c = fedwan::codec_by_name(codec);
  const size_t n = elements(state);
  const std::vector<uint8_t> payload = encoded(c, n);
  std::vector<float> out(n);
  for (auto _ : state) {
    c.decode(payload.data(), n, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void run_decode_accumulate(benchmark::State& state, const char* codec) {
  const fedwan::Codec& c = fedwan::codec_by_name(codec);
  const size_t n = elements(state);
  const std::vector<uint8_t> payload = encoded(c, n);
  std::vector<float> acc(n, 0.0f);
  for (auto _ : state) {
    c.decode_accumulate(payload.data(), n, 0.25f, acc.data());
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void run_validate(benchmark::State& state, const char* codec) {
  const fedwan::Codec& c = fedwan::codec_by_name(codec);
  const size_t n = elements(state);
  const std::vector<uint8_t> payload = encoded(c, n);
  for (auto _ : state) benchmark::DoNotOptimize(c.validate(payload.data(), payload.size(), n));
  finish(state);
}

void BM_Codec_Fp32Encode(benchmark::State& s) { run_encode(s, "fp32", false); }
void BM_Codec_Fp16Encode(benchmark::State& s) { run_encode(s, "fp16", false); }
void BM_Codec_Fp16EncodeEF(benchmark::State& s) { run_encode(s, "fp16", true); }
void BM_Codec_Fp16Decode(benchmark::State& s) { run_decode(s, "fp16"); }
void BM_Codec_Fp16DecodeAccumulate(benchmark::State& s) { run_decode_accumulate(s, "fp16"); }
void BM_Codec_Fp16Validate(benchmark::State& s) { run_validate(s, "fp16"); }
void BM_Codec_Bf16Encode(benchmark::State& s) { run_encode(s, "bf16", false); }
void BM_Codec_Bf16EncodeEF(benchmark::State& s) { run_encode(s, "bf16", true); }
void BM_Codec_Bf16Decode(benchmark::State& s) { run_decode(s, "bf16"); }
void BM_Codec_Int8Encode(benchmark::State& s) { run_encode(s, "int8", false); }
void BM_Codec_Int8EncodeEF(benchmark::State& s) { run_encode(s, "int8", true); }
void BM_Codec_Int8Decode(benchmark::State& s) { run_decode(s, "int8"); }
void BM_Codec_Int8DecodeAccumulate(benchmark::State& s) { run_decode_accumulate(s, "int8"); }
void BM_Codec_Int8Validate(benchmark::State& s) { run_validate(s, "int8"); }

#define FEDWAN_CHUNK_SIZES Arg(kMiB)->Arg(4 * kMiB)
BENCHMARK(BM_Codec_Memcpy)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Fp32Encode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Fp16Encode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Fp16EncodeEF)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Fp16Decode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Fp16DecodeAccumulate)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Fp16Validate)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Bf16Encode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Bf16EncodeEF)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Bf16Decode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Int8Encode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Int8EncodeEF)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Int8Decode)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Int8DecodeAccumulate)->FEDWAN_CHUNK_SIZES;
BENCHMARK(BM_Codec_Int8Validate)->FEDWAN_CHUNK_SIZES;
#undef FEDWAN_CHUNK_SIZES

}  // namespace
