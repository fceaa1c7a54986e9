// The per-chunk data path of one sender and one aggregator, in one thread:
// encode (fp16 + error feedback) -> frame -> parse -> validate ->
// decode_accumulate, over a 10M-element model in 1 MiB chunks, against a
// memcpy of the same model in the same chunks. Bytes processed are the
// model's fp32 bytes. Names follow BM_<group>_<what>/<chunk bytes>.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "fedwan/codec.hpp"
#include "wire/frame.hpp"

namespace {

constexpr size_t kModelElements = 10'000'000;
constexpr int64_t kMiB = int64_t{1} << 20;

std::vector<float> model_delta() {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> v(kModelElements);
  for (auto& x : v) x = d(rng);
  return v;
}

void finish(benchmark::State& state) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kModelElements * sizeof(float)));
}

void BM_Pipeline_Memcpy(benchmark::State& state) {
  const size_t chunk = size_t(state.range(0)) / sizeof(float);
  const std::vector<float> src = model_delta();
  std::vector<float> dst(kModelElements);
  for (auto _ : state) {
    for (size_t off = 0; off < kModelElements; off += chunk) {
      const size_t n = std::min(chunk, kModelElements - off);
      std::memcpy(dst.data() + off, src.data() + off, n * sizeof(float));
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void BM_Pipeline_Fp16EF(benchmark::State& state) {
  namespace wire = fedwan::wire;
  const fedwan::Codec& codec = fedwan::codec_by_name("fp16");
  const size_t chunk = size_t(state.range(0)) / sizeof(float);
  const uint32_t chunks = uint32_t((kModelElements + chunk - 1) / chunk);
  const std::vector<float> delta = model_delta();
  std::vector<float> residual(kModelElements, 0.0f), acc(kModelElements, 0.0f);
  std::vector<uint8_t> payload(codec.encoded_size(chunk));
  wire::FrameHeader h;
  h.type = wire::MsgType::kDelta;
  h.codec = static_cast<uint8_t>(codec.id());
  h.job_id = 1;
  h.sender = 7;
  h.chunk_count = chunks;
  h.total_elements = kModelElements;
  h.weight = 0.5;
  size_t rejected = 0;
  for (auto _ : state) {
    for (uint32_t c = 0; c < chunks; ++c) {
      const size_t off = size_t(c) * chunk;
      const size_t n = std::min(chunk, kModelElements - off);
      const size_t bytes = codec.encoded_size(n);
      codec.encode(delta.data() + off, n, residual.data() + off, payload.data());
      h.chunk_index = c;
      h.element_count = uint32_t(n);
      h.payload_length = uint32_t(bytes);
      const std::vector<uint8_t> frame = wire::encode_frame(h, payload.data(), bytes);
      const wire::ParsedFrame f = wire::parse_frame(frame.data(), frame.size());
      if (!f.ok() || !codec.validate(f.payload, f.payload_size, f.header.element_count)) {
        ++rejected;
        continue;
      }
      codec.decode_accumulate(f.payload, f.header.element_count, float(f.header.weight),
                              acc.data() + off);
    }
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  if (rejected) state.SkipWithError("a frame of the pipeline was rejected");
  finish(state);
}

BENCHMARK(BM_Pipeline_Memcpy)->Arg(kMiB)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pipeline_Fp16EF)->Arg(kMiB)->Unit(benchmark::kMillisecond);

}  // namespace
