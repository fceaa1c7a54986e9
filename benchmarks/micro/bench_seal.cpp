// The cost of encrypting what a site sends: sealing one chunk's fp16 frame,
// against raw AES-256-GCM measured in the same run (see report.py for the
// ratios). Bytes processed are the chunk's encoded fp16 bytes (half its fp32
// bytes, plus the block scales) except in RawAes256GcmModel, which encrypts
// the chunk's fp32 bytes: the gate compares the pipeline with it chunk for
// chunk, i.e. on the same model bytes. Times are wall-clock: the
// pipelined cases seal on a second thread, which the CPU time of the
// benchmark thread would not count.
// Names follow BM_Seal_<what>/<fp32 chunk bytes>; report.py relies on that.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <vector>

#include "common/fingerprint.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "security/aead.hpp"
#include "security/frame_protector.hpp"
#include "security/sealing_pipeline.hpp"
#include "wire/frame.hpp"

namespace {

namespace sec = fedwan::security;
namespace wire = fedwan::wire;
using Bytes = std::vector<uint8_t>;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr uint32_t kStreamChunks = 16;  // one stream: a 4M- or 16M-element model
constexpr size_t kOffFlags = 7;         // header flags byte (wire/frame.hpp)
const sec::AeadKey kKey{0x6b, 0x65, 0x79};
const sec::AeadNonce kIv{0x69, 0x76};

// A pseudo-gradient-like chunk: small values around zero.
std::vector<float> delta_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

const fedwan::Codec& fp16() { return fedwan::codec_by_name("fp16"); }
size_t elements(const benchmark::State& state) { return size_t(state.range(0)) / sizeof(float); }

// The chunks of one fp32 stream, encoded with error feedback into frames as a
// site's sender does.
class ChunkStream {
 public:
  ChunkStream(size_t chunk_elements, uint32_t chunks)
      : n_(chunk_elements),
        payload_(fp16().encoded_size(chunk_elements)),
        values_(delta_values(chunk_elements * chunks, 2)),
        residual_(chunk_elements * chunks, 0.0f) {
    h_.type = wire::MsgType::kDelta;
    h_.codec = static_cast<uint8_t>(fp16().id());
    h_.job_id = 1;
    h_.round = 1;
    h_.sender = 7;
    h_.chunk_count = chunks;
    h_.element_count = uint32_t(chunk_elements);
    h_.total_elements = uint64_t(chunk_elements) * chunks;
    h_.weight = 0.5;
    h_.payload_length = uint32_t(payload_);
  }

  size_t payload_bytes() const { return payload_; }
  size_t sealed_bytes() const { return wire::kHeaderSize + payload_ + sec::kSealTrailer; }

  // Writes chunk c's frame into `frame`, whose capacity should already hold
  // the sealed size (then nothing is allocated).
  void encode(uint32_t c, Bytes& frame) {
    frame.resize(wire::kHeaderSize + payload_);
    h_.chunk_index = c;
    wire::encode_header(h_, frame.data());
    fp16().encode(values_.data() + size_t(c) * n_, n_, residual_.data() + size_t(c) * n_,
                  frame.data() + wire::kHeaderSize);
  }

  Bytes new_buffer() const {
    Bytes b;
    b.reserve(sealed_bytes());
    return b;
  }

 private:
  size_t n_, payload_;
  std::vector<float> values_, residual_;
  wire::FrameHeader h_;
};

void finish(benchmark::State& state, size_t encoded_bytes_per_iteration) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(encoded_bytes_per_iteration));
}

// 1. The baseline: the AEAD alone over exactly the encoded fp16 bytes.
void run_raw(benchmark::State& state, sec::AeadAlgorithm algorithm) {
  const size_t n = elements(state);
  Bytes payload(fp16().encoded_size(n));
  const std::vector<float> values = delta_values(n, 3);
  fp16().encode(values.data(), n, nullptr, payload.data());
  sec::AeadCipher cipher(algorithm, kKey);
  state.SetLabel(sec::aead_description(algorithm));  // the library FEDWAN_AEAD_LIBRARY chose
  uint8_t tag[sec::kAeadTagSize];
  uint64_t seq = 0;
  for (auto _ : state) {
    cipher.seal(sec::nonce_for(kIv, seq++), nullptr, 0, payload.data(), payload.size(),
                payload.data(), tag);
    benchmark::DoNotOptimize(payload.data());
    benchmark::DoNotOptimize(tag);
    benchmark::ClobberMemory();
  }
  finish(state, payload.size());
}

// 2. FrameSealer over an encoded frame: header and trailer handling, the
// associated data and the rekey checks on top of the raw cipher.
void BM_Seal_Frame(benchmark::State& state) {
  ChunkStream stream(elements(state), 1);
  Bytes frame = stream.new_buffer();
  stream.encode(0, frame);
  const size_t plain_size = frame.size();
  sec::FrameSealer sealer(sec::AeadAlgorithm::kAes256Gcm, kKey, kIv);
  for (auto _ : state) {
    sealer.seal(frame);
    benchmark::DoNotOptimize(frame.data());
    benchmark::ClobberMemory();
    // Back to an unsealed frame of the same size: the ciphertext is simply
    // the next payload (the cipher does not care what the bytes are).
    frame.resize(plain_size);
    frame[kOffFlags] &= static_cast<uint8_t>(~sec::kFlagSealed);
  }
  finish(state, stream.payload_bytes());
}

// 3. One thread does a sender's whole per-chunk work: fp16 encode with error
// feedback into the frame buffer, then seal.
void BM_Seal_EncodeThenSeal(benchmark::State& state) {
  ChunkStream stream(elements(state), 1);
  Bytes frame = stream.new_buffer();
  sec::FrameSealer sealer(sec::AeadAlgorithm::kAes256Gcm, kKey, kIv);
  for (auto _ : state) {
    stream.encode(0, frame);
    sealer.seal(frame);
    benchmark::DoNotOptimize(frame.data());
    benchmark::ClobberMemory();
  }
  finish(state, stream.payload_bytes());
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 3b. The serial work over the same 16-chunk stream as the pipelined case
// (distinct chunks, so the fp32 values and residuals come from memory rather
// than cache, as at a real site): what pipelining is measured against.
void BM_Seal_SerialStream(benchmark::State& state) {
  ChunkStream stream(elements(state), kStreamChunks);
  Bytes frame = stream.new_buffer();
  sec::FrameSealer sealer(sec::AeadAlgorithm::kAes256Gcm, kKey, kIv);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t c = 0; c < kStreamChunks; ++c) {
      stream.encode(c, frame);
      sealer.seal(frame);
      benchmark::DoNotOptimize(frame.data());
      benchmark::ClobberMemory();
    }
    state.SetIterationTime(seconds_since(t0) / kStreamChunks);  // per chunk
  }
  finish(state, stream.payload_bytes());
}

// 4. What a site does: the caller encodes chunk c+1 while the pipeline's
// worker seals chunk c. One iteration is a whole 16-chunk stream, filling
// and draining the pipeline included, reported per chunk. Sealed buffers
// are recycled as the next frames' buffers, as a sender does once a frame
// has been handed to the socket.
void run_pipelined(benchmark::State& state, sec::AeadAlgorithm algorithm) {
  ChunkStream stream(elements(state), kStreamChunks);
  sec::FrameSealer sealer(algorithm, kKey, kIv);
  sec::SealingPipeline pipeline(sealer);  // default depth, as a site uses
  std::vector<Bytes> spare;
  bool stalled = false;
  auto take = [&] {
    Bytes sealed;
    if (!pipeline.next(&sealed, std::chrono::seconds(10))) {
      stalled = true;
      return;
    }
    benchmark::DoNotOptimize(sealed.data());
    spare.push_back(std::move(sealed));
  };
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t c = 0; c < kStreamChunks && !stalled; ++c) {
      Bytes frame;
      if (spare.empty()) {
        frame = stream.new_buffer();
      } else {
        frame = std::move(spare.back());
        spare.pop_back();
      }
      stream.encode(c, frame);
      if (pipeline.in_flight() == pipeline.depth()) take();
      pipeline.submit(std::move(frame));
    }
    while (pipeline.in_flight() > 0 && !stalled) take();
    state.SetIterationTime(seconds_since(t0) / kStreamChunks);  // per chunk
  }
  if (stalled) state.SkipWithError("the sealing pipeline returned no frame within 10 s");
  finish(state, stream.payload_bytes());
}

// 6. The floor the gate compares against: AES-256-GCM of the model update
// itself, the stream's raw fp32 chunks (what sealing an uncompressed update
// would cost), streamed like the pipelined case. Bytes processed are fp32
// bytes here; report.py compares times per chunk, i.e. the same model bytes.
void BM_Seal_RawAes256GcmModel(benchmark::State& state) {
  const size_t n = elements(state);
  const std::vector<float> values = delta_values(n * kStreamChunks, 2);
  Bytes out(n * sizeof(float));
  sec::AeadCipher cipher(sec::AeadAlgorithm::kAes256Gcm, kKey);
  uint8_t tag[sec::kAeadTagSize];
  uint64_t seq = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t c = 0; c < kStreamChunks; ++c) {
      const auto* in = reinterpret_cast<const uint8_t*>(values.data() + size_t(c) * n);
      cipher.seal(sec::nonce_for(kIv, seq++), nullptr, 0, in, out.size(), out.data(), tag);
      benchmark::DoNotOptimize(out.data());
      benchmark::DoNotOptimize(tag);
    }
    state.SetIterationTime(seconds_since(t0) / kStreamChunks);  // per chunk
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(out.size()));
}

// One chunk's fp16 payload, as it goes on the wire: what 7 and 8 digest.
Bytes encoded_chunk(size_t n) {
  Bytes payload(fp16().encoded_size(n));
  const std::vector<float> values = delta_values(n, 3);
  fp16().encode(values.data(), n, nullptr, payload.data());
  return payload;
}

// 7. What the audit log adds per byte: SHA-256 of one chunk's encoded
// payload, as its sender and every aggregator that takes it hash it for
// their audit entries (OpenSSL, with the CPU's SHA extensions where it has
// them). Ratio to the raw cipher: what a digest of every byte costs beside
// encrypting it.
void BM_Seal_Sha256(benchmark::State& state) {
  const Bytes payload = encoded_chunk(elements(state));
  for (auto _ : state) {
    fedwan::Sha256Digest d = fedwan::sha256(payload.data(), payload.size());
    benchmark::DoNotOptimize(d);
  }
  finish(state, payload.size());
}

// 8. The same payload's fingerprint64 (GMAC under a key of the process's):
// what an aggregator without an audit log tells replayed copies by.
void BM_Seal_Fingerprint(benchmark::State& state) {
  const Bytes payload = encoded_chunk(elements(state));
  for (auto _ : state) {
    uint64_t f = fedwan::fingerprint64(payload.data(), payload.size());
    benchmark::DoNotOptimize(f);
  }
  finish(state, payload.size());
}

void BM_Seal_RawAes256Gcm(benchmark::State& s) { run_raw(s, sec::AeadAlgorithm::kAes256Gcm); }
void BM_Seal_RawChaCha20Poly1305(benchmark::State& s) {
  run_raw(s, sec::AeadAlgorithm::kChaCha20Poly1305);
}
void BM_Seal_Pipelined(benchmark::State& s) { run_pipelined(s, sec::AeadAlgorithm::kAes256Gcm); }
void BM_Seal_PipelinedChaCha20Poly1305(benchmark::State& s) {
  run_pipelined(s, sec::AeadAlgorithm::kChaCha20Poly1305);
}

#define FEDWAN_CHUNK_SIZES Arg(kMiB)->Arg(4 * kMiB)
BENCHMARK(BM_Seal_RawAes256Gcm)->FEDWAN_CHUNK_SIZES->UseRealTime();
BENCHMARK(BM_Seal_RawAes256GcmModel)->FEDWAN_CHUNK_SIZES->UseManualTime();
BENCHMARK(BM_Seal_Sha256)->FEDWAN_CHUNK_SIZES->UseRealTime();
BENCHMARK(BM_Seal_Fingerprint)->FEDWAN_CHUNK_SIZES->UseRealTime();
BENCHMARK(BM_Seal_Frame)->FEDWAN_CHUNK_SIZES->UseRealTime();
BENCHMARK(BM_Seal_EncodeThenSeal)->FEDWAN_CHUNK_SIZES->UseRealTime();
BENCHMARK(BM_Seal_SerialStream)->FEDWAN_CHUNK_SIZES->UseManualTime();
BENCHMARK(BM_Seal_Pipelined)->FEDWAN_CHUNK_SIZES->UseManualTime();
BENCHMARK(BM_Seal_RawChaCha20Poly1305)->FEDWAN_CHUNK_SIZES->UseRealTime();
BENCHMARK(BM_Seal_PipelinedChaCha20Poly1305)->FEDWAN_CHUNK_SIZES->UseManualTime();
#undef FEDWAN_CHUNK_SIZES

}  // namespace
