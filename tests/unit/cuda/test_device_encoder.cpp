// The GPU encoders against the CPU codecs: same payload bytes and the same
// residual, bit for bit, for every codec, chunk shape and magnitude. The
// tests that need a GPU skip without one; the others run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"

namespace fedwan::cuda {
namespace {

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"; \
  } while (0)

// n floats of GPU memory, freed on scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    if (cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMalloc failed");
    }
    upload(host);
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return static_cast<float*>(p_); }
  void upload(const std::vector<float>& host) {
    if (n_ > 0) cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> download() const {
    std::vector<float> out(n_);
    if (n_ > 0) cudaMemcpy(out.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

// Blocks of wildly different magnitudes, with zeros, subnormals, exact
// halfway cases and values near FLT_MAX mixed in.
std::vector<float> awkward_chunk(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::vector<float> v(n);
  float magnitude = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 256 == 0) magnitude = std::ldexp(1.0f, exponent(rng));
    v[i] = normal(rng) * magnitude;
    switch (i % 97) {
      case 3: v[i] = 0.0f; break;
      case 11: v[i] = -0.0f; break;
      case 29: v[i] = std::numeric_limits<float>::denorm_min() * float(i % 7); break;
      case 41: v[i] = 0.5f; break;  // a rounding tie under power-of-two scales
      case 59: v[i] = -2.5f; break;
      default: break;
    }
  }
  // Near FLT_MAX (the fp16 clamp), with room for three rounds of residual.
  if (n > 5000) v[5000] = std::numeric_limits<float>::max() * 0.9f;
  if (n > 7000) v[7000] = -std::numeric_limits<float>::max() * 0.9f;
  return v;
}

const char* const kCodecs[] = {"fp32", "fp16", "bf16", "int8"};
const size_t kSizes[] = {0, 1, 255, 256, 257, 2047, 2048, 2049, 100003, size_t{1} << 20};

TEST(DeviceEncoder, UnknownCodecIsAConfigErrorEverywhere) {
  DeviceEncoderOptions o;
  o.codec = "zstd";
  EXPECT_THROW(DeviceEncoder{o}, ConfigError);
}

TEST(DeviceEncoder, HostMemoryIsNotDeviceMemory) {
  std::vector<float> host(16, 1.0f);
  EXPECT_FALSE(is_device_pointer(host.data()));
  EXPECT_FALSE(is_device_pointer(nullptr));
}

TEST(DeviceEncoder, WithoutAGpuTheEncoderSaysSo) {
  if (device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  try {
    DeviceEncoder encoder{DeviceEncoderOptions{}};
    FAIL() << "an encoder without a GPU";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(DeviceEncoder, MatchesTheCpuCodecsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const char* name : kCodecs) {
    const Codec& cpu = codec_by_name(name);
    DeviceEncoderOptions o;
    o.codec = name;
    o.max_elements = size_t{1} << 20;
    DeviceEncoder gpu(o);
    for (size_t n : kSizes) {
      for (bool feedback : {false, true}) {
        SCOPED_TRACE(std::string(name) + " n=" + std::to_string(n) +
                     (feedback ? " with residual" : " without residual"));
        std::vector<float> cpu_residual(n, 0.0f);
        DeviceFloats gpu_residual(cpu_residual);
        // Three rounds, so the residual the rounds carry forward is compared too.
        for (uint32_t round = 0; round < 3; ++round) {
          const std::vector<float> x = awkward_chunk(n, 17 * uint32_t(n) + round);
          DeviceFloats in(x);
          std::vector<uint8_t> want(cpu.encoded_size(n));
          cpu.encode(x.data(), n, feedback ? cpu_residual.data() : nullptr, want.data());
          const std::vector<uint8_t> got =
              gpu.encode(in.get(), feedback ? gpu_residual.get() : nullptr, n);
          ASSERT_EQ(got, want) << "round " << round;
          if (feedback) ASSERT_EQ(bits(gpu_residual.download()), bits(cpu_residual));
          EXPECT_EQ(bits(in.download()), bits(x)) << "the input must not change";
        }
      }
    }
  }
}

TEST(DeviceEncoder, SlotsOverlapAndEachKeepsItsOwnChunk) {
  SKIP_WITHOUT_GPU();
  const Codec& cpu = codec_by_name("fp16");
  DeviceEncoderOptions o;
  o.max_elements = 50000;
  o.slots = 3;
  DeviceEncoder gpu(o);
  std::vector<std::vector<float>> chunks;
  std::vector<std::unique_ptr<DeviceFloats>> device;
  for (int s = 0; s < 3; ++s) {
    chunks.push_back(awkward_chunk(40000 + size_t(s), uint32_t(s)));
    device.push_back(std::make_unique<DeviceFloats>(chunks.back()));
    gpu.encode_async(s, device.back()->get(), nullptr, chunks.back().size());
  }
  EXPECT_THROW(gpu.encode_async(1, device[1]->get(), nullptr, 10), ConfigError)
      << "a slot in flight is not reused before wait()";
  for (int s = 2; s >= 0; --s) {
    const size_t n = chunks[size_t(s)].size();
    std::vector<uint8_t> want(cpu.encoded_size(n));
    cpu.encode(chunks[size_t(s)].data(), n, nullptr, want.data());
    const DeviceEncoder::Encoded got = gpu.wait(s);
    ASSERT_EQ(got.size, want.size());
    EXPECT_EQ(std::memcmp(got.data, want.data(), want.size()), 0) << "slot " << s;
  }
  EXPECT_THROW(gpu.wait(0), ConfigError) << "nothing in flight";
}

TEST(DeviceEncoder, NonFiniteInputThrowsAndLeavesTheResidualAlone) {
  SKIP_WITHOUT_GPU();
  // The first bad index is the smallest whichever thread, warp or block
  // meets it: {bad indices, the one the error names}.
  const std::pair<std::vector<size_t>, size_t> cases[] = {
      {{8500, 8700}, 8500}, {{2303, 2049}, 2049}, {{8999, 0}, 0}, {{8999}, 8999}};
  for (const char* name : kCodecs) {
    DeviceEncoderOptions o;
    o.codec = name;
    o.max_elements = 10000;
    DeviceEncoder gpu(o);
    for (const auto& [bad, first] : cases) {
      for (bool feedback : {true, false}) {
        SCOPED_TRACE(std::string(name) + " first bad " + std::to_string(first) +
                     (feedback ? " with residual" : " without residual"));
        std::vector<float> x = awkward_chunk(9000, 5);
        std::vector<float> residual = awkward_chunk(9000, 6);
        for (float& r : residual) r *= 1e-3f;
        for (size_t k = 0; k < bad.size(); ++k) {
          x[bad[k]] = k % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                 : std::numeric_limits<float>::infinity();
        }
        DeviceFloats in(x), res(residual);
        try {
          gpu.encode(in.get(), feedback ? res.get() : nullptr, x.size());
          FAIL() << "a NaN was encoded";
        } catch (const ConfigError&) {
          FAIL() << "a bad value is not a configuration error";
        } catch (const Error& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(std::string("codec ") + name), std::string::npos) << what;
          EXPECT_NE(what.find("element " + std::to_string(first) + " of 9000"), std::string::npos)
              << what;
        }
        EXPECT_EQ(bits(res.download()), bits(residual));
        // The encoder is still usable afterwards.
        for (size_t i : bad) x[i] = 1.0f;
        in.upload(x);
        const Codec& cpu = codec_by_name(name);
        std::vector<uint8_t> want(cpu.encoded_size(x.size()));
        cpu.encode(x.data(), x.size(), nullptr, want.data());
        EXPECT_EQ(gpu.encode(in.get(), nullptr, x.size()), want);
      }
    }
  }
}

TEST(DeviceEncoder, DifferencesMatchTheHostDeltaThenEncode) {
  SKIP_WITHOUT_GPU();
  for (const char* name : kCodecs) {
    SCOPED_TRACE(name);
    const Codec& cpu = codec_by_name(name);
    DeviceEncoderOptions o;
    o.codec = name;
    o.max_elements = 70000;
    DeviceEncoder gpu(o);
    const std::vector<float> a = awkward_chunk(70000, 21), b = awkward_chunk(70000, 22);
    std::vector<float> delta(a.size());
    for (size_t i = 0; i < a.size(); ++i) delta[i] = a[i] - b[i];
    DeviceFloats da(a), db(b);
    for (bool feedback : {true, false}) {
      SCOPED_TRACE(feedback ? "with residual" : "without residual");
      std::vector<float> cpu_residual(a.size(), 0.0f);
      DeviceFloats gpu_residual(cpu_residual);
      for (int round = 0; round < 2; ++round) {
        std::vector<uint8_t> want(cpu.encoded_size(a.size()));
        cpu.encode(delta.data(), delta.size(), feedback ? cpu_residual.data() : nullptr,
                   want.data());
        gpu.encode_difference_async(0, da.get(), db.get(), feedback ? gpu_residual.get() : nullptr,
                                    a.size());
        const DeviceEncoder::Encoded got = gpu.wait(0);
        ASSERT_EQ(got.size, want.size());
        EXPECT_EQ(std::memcmp(got.data, want.data(), want.size()), 0) << "round " << round;
        EXPECT_EQ(bits(gpu_residual.download()), bits(cpu_residual));
      }
    }
  }
}

TEST(DeviceUpdateEncoder, ChunksAndResidualMatchTheHostPath) {
  SKIP_WITHOUT_GPU();
  const size_t n = 10000, chunk = 4096;
  const std::vector<float> params = awkward_chunk(n, 31);
  std::vector<float> anchor = awkward_chunk(n, 32);
  DeviceFloats device_params(params);
  DeviceUpdateEncoder gpu(0, device_params.get(), n, chunk);
  gpu.set_anchor(anchor.data());
  const Codec& codec = codec_by_name("int8");
  std::vector<float> residual(n, 0.0f), delta(chunk);
  for (uint64_t off = 0; off < n; off += chunk) {
    const uint32_t len = uint32_t(std::min(chunk, n - off));
    for (uint32_t k = 0; k < len; ++k) delta[k] = anchor[off + k] - params[off + k];
    std::vector<uint8_t> want(codec.encoded_size(len)), got(codec.encoded_size(len));
    codec.encode(delta.data(), len, residual.data() + off, want.data());
    gpu.encode(codec, off, len, true, got.data());
    ASSERT_EQ(got, want) << "chunk at " << off;
  }
  std::vector<float> back(n);
  gpu.read_residual(back.data(), n);
  EXPECT_EQ(bits(back), bits(residual));
  // A resumed residual goes back in and is used by the next chunk.
  std::vector<float> resumed = awkward_chunk(n, 33);
  for (float& r : resumed) r *= 1e-6f;
  gpu.write_residual(resumed.data(), n);
  gpu.read_residual(back.data(), n);
  EXPECT_EQ(bits(back), bits(resumed));
  EXPECT_THROW(gpu.read_residual(back.data(), n - 1), ConfigError);
  EXPECT_THROW(gpu.encode(codec, n - 10, 11, true, nullptr), ConfigError);
}

TEST(DeviceUpdateEncoder, WithoutAGpuItSaysSo) {
  if (device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  std::vector<float> host(16, 1.0f);
  EXPECT_THROW(DeviceUpdateEncoder(0, host.data(), host.size(), 16), ConfigError);
}

TEST(DeviceEncoder, RefusesHostPointersAndOversizedChunks) {
  SKIP_WITHOUT_GPU();
  DeviceEncoderOptions o;
  o.max_elements = 1000;
  DeviceEncoder gpu(o);
  std::vector<float> host(1000, 1.0f);
  EXPECT_THROW(gpu.encode(host.data(), nullptr, host.size()), ConfigError);
  DeviceFloats big(std::vector<float>(1001, 1.0f));
  EXPECT_THROW(gpu.encode(big.get(), nullptr, 1001), ConfigError);
  EXPECT_TRUE(is_device_pointer(big.get()));
}

}  // namespace
}  // namespace fedwan::cuda
