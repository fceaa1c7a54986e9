// DeviceEncoder: the codec kernels (codec_kernels.cu) behind a pipeline of
// slots. Each slot owns a stream, the device payload and scratch, a pinned
// host copy and an event; encode_async queues kernels + one device-to-host
// copy of the encoded bytes on the slot's stream, wait polls the event.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codec_kernels.hpp"
#include "cuda_check.hpp"
#include "device_scope.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"

namespace fedwan::cuda {
namespace {

constexpr unsigned long long kNoBad = ~0ull;

// The registered codec `name`, when the kernels encode it. Any other name,
// registered or not, gets the one message that says what the GPU encodes.
const Codec& gpu_codec(const std::string& name) {
  const Codec* codec = nullptr;
  for (const std::string& known : codec_names()) {
    if (known == name) codec = &codec_by_name(name);
  }
  if (codec == nullptr || !kernels::has_kernels(codec->id())) {
    throw ConfigError("DeviceEncoder: no GPU encoder for codec '" + name +
                      "'; the GPU encodes fp32, fp16, bf16 and int8");
  }
  return *codec;
}

template <class T, class Free>
struct Owned {
  T p{};
  Free free{};
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (p) free(p);
  }
};
struct FreeDevice {
  void operator()(void* p) const { cudaFree(p); }
};
struct FreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct FreeStream {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct FreeEvent {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};

struct Slot {
  Owned<cudaStream_t, FreeStream> stream;
  Owned<cudaEvent_t, FreeEvent> inputs_ready;  // recorded on the default stream
  Owned<cudaEvent_t, FreeEvent> done;
  Owned<void*, FreeDevice> payload;    // encoded bytes on the device
  Owned<void*, FreeDevice> block_max;  // scratch
  Owned<void*, FreeDevice> first_bad;  // one unsigned long long
  Owned<void*, FreeHost> host;         // encoded bytes, pinned
  Owned<void*, FreeHost> host_bad;     // first_bad, pinned
  bool in_flight = false;
  const float* in = nullptr;
  const float* minus = nullptr;
  const float* residual = nullptr;
  size_t n = 0;
};

void require_device_pointer(const void* p, int device, const char* what) {
  cudaPointerAttributes attr{};
  const cudaError_t status = cudaPointerGetAttributes(&attr, p);
  if (status != cudaSuccess) cudaGetLastError();
  const bool on_device = status == cudaSuccess &&
                         (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
  if (!on_device) {
    throw ConfigError(std::string("DeviceEncoder: ") + what +
                      " is not GPU memory; encode host data with the CPU codec "
                      "(fedwan::codec_by_name) instead");
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    throw ConfigError(std::string("DeviceEncoder: ") + what + " lives on GPU " +
                      std::to_string(attr.device) + " but the encoder runs on GPU " +
                      std::to_string(device));
  }
}

}  // namespace

struct DeviceEncoder::Impl {
  DeviceEncoderOptions options;
  const Codec* codec = nullptr;
  size_t payload_capacity = 0;
  std::vector<Slot> slots;

  Slot& slot_at(int slot) {
    if (slot < 0 || slot >= int(slots.size())) {
      throw ConfigError("DeviceEncoder: slot " + std::to_string(slot) + " out of range [0, " +
                        std::to_string(slots.size()) + ")");
    }
    return slots[size_t(slot)];
  }

  void start(int slot, const float* in, const float* minus, float* residual, size_t n);

  [[noreturn]] void throw_non_finite(const Slot& s, unsigned long long index) const {
    float v = 0.0f, b = 0.0f, r = 0.0f;
    cudaMemcpy(&v, s.in + index, sizeof v, cudaMemcpyDeviceToHost);
    if (s.minus) cudaMemcpy(&b, s.minus + index, sizeof b, cudaMemcpyDeviceToHost);
    if (s.residual) cudaMemcpy(&r, s.residual + index, sizeof r, cudaMemcpyDeviceToHost);
    cudaGetLastError();
    const float x = s.minus ? v - b : v;
    const float value = s.residual ? x + r : x;
    throw Error("codec " + options.codec + " (GPU): cannot encode a non-finite value (" +
                std::to_string(value) + (s.residual ? " in input + residual" : " in input") +
                " at element " + std::to_string(index) + " of " + std::to_string(s.n) +
                "); the model update diverged or was not initialised");
  }
};

DeviceEncoder::DeviceEncoder(const DeviceEncoderOptions& options) : impl_(new Impl) {
  Impl& m = *impl_;
  m.options = options;
  m.codec = &gpu_codec(options.codec);
  const int devices = device_count();
  if (devices == 0) {
    throw ConfigError("DeviceEncoder: no CUDA device on this machine; encode with the CPU "
                      "codec instead");
  }
  if (options.device < 0 || options.device >= devices) {
    throw ConfigError("DeviceEncoder: device " + std::to_string(options.device) +
                      " does not exist (this machine has " + std::to_string(devices) + ")");
  }
  if (options.slots < 1 || options.slots > 64) {
    throw ConfigError("DeviceEncoder: slots must be 1..64, not " + std::to_string(options.slots));
  }
  if (options.max_elements == 0 || options.max_elements > (size_t{1} << 34)) {
    throw ConfigError("DeviceEncoder: max_elements must be 1..2^34");
  }
  if (options.timeout.count() <= 0) throw ConfigError("DeviceEncoder: timeout must be positive");

  DeviceScope scope(options.device);
  m.payload_capacity = m.codec->encoded_size(options.max_elements);
  const size_t max_blocks = kernels::block_count(m.codec->id(), options.max_elements);
  m.slots = std::vector<Slot>(size_t(options.slots));
  for (Slot& s : m.slots) {
    FEDWAN_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream.p, cudaStreamNonBlocking));
    FEDWAN_CUDA_CHECK(cudaEventCreateWithFlags(&s.inputs_ready.p, cudaEventDisableTiming));
    FEDWAN_CUDA_CHECK(cudaEventCreateWithFlags(&s.done.p, cudaEventDisableTiming));
    FEDWAN_CUDA_CHECK(cudaMalloc(&s.payload.p, std::max<size_t>(m.payload_capacity, 1)));
    FEDWAN_CUDA_CHECK(cudaMalloc(&s.block_max.p, max_blocks * sizeof(uint32_t)));
    FEDWAN_CUDA_CHECK(cudaMalloc(&s.first_bad.p, sizeof(unsigned long long)));
    FEDWAN_CUDA_CHECK(cudaMallocHost(&s.host.p, std::max<size_t>(m.payload_capacity, 1)));
    FEDWAN_CUDA_CHECK(cudaMallocHost(&s.host_bad.p, sizeof(unsigned long long)));
  }
}

DeviceEncoder::~DeviceEncoder() {
  if (!impl_) return;
  // Nothing may be freed under a running kernel or copy.
  for (Slot& s : impl_->slots) {
    if (s.stream.p) cudaStreamSynchronize(s.stream.p);
  }
  cudaGetLastError();
}

const std::string& DeviceEncoder::codec() const { return impl_->options.codec; }
int DeviceEncoder::slots() const { return int(impl_->slots.size()); }
size_t DeviceEncoder::encoded_size(size_t n) const { return impl_->codec->encoded_size(n); }

void DeviceEncoder::encode_async(int slot, const float* in, float* residual, size_t n) {
  impl_->start(slot, in, nullptr, residual, n);
}

void DeviceEncoder::encode_difference_async(int slot, const float* a, const float* b,
                                            float* residual, size_t n) {
  impl_->start(slot, a, b, residual, n);
}

void DeviceEncoder::Impl::start(int slot, const float* in, const float* minus, float* residual,
                                size_t n) {
  Impl& m = *this;
  Slot& s = m.slot_at(slot);
  if (s.in_flight) {
    throw ConfigError("DeviceEncoder: slot " + std::to_string(slot) +
                      " is still in flight; wait() for it first");
  }
  if (n > m.options.max_elements) {
    throw ConfigError("DeviceEncoder: a chunk of " + std::to_string(n) +
                      " elements exceeds max_elements (" + std::to_string(m.options.max_elements) +
                      "); raise DeviceEncoderOptions::max_elements");
  }
  DeviceScope scope(m.options.device);
  if (n > 0) {
    require_device_pointer(in, m.options.device, "the input");
    if (minus) require_device_pointer(minus, m.options.device, "the subtrahend");
    if (residual) require_device_pointer(residual, m.options.device, "the residual");
  }
  // The producer's kernels (autograd, the delta) run on the default stream.
  FEDWAN_CUDA_CHECK(cudaEventRecord(s.inputs_ready.p, cudaStreamLegacy));
  FEDWAN_CUDA_CHECK(cudaStreamWaitEvent(s.stream.p, s.inputs_ready.p, 0));
  FEDWAN_CUDA_CHECK(cudaMemsetAsync(s.first_bad.p, 0xFF, sizeof(unsigned long long), s.stream.p));

  kernels::EncodeArgs args;
  args.in = in;
  args.minus = minus;
  args.residual = residual;
  args.n = n;
  args.out = static_cast<uint8_t*>(s.payload.p);
  args.block_max = static_cast<uint32_t*>(s.block_max.p);
  args.first_bad = static_cast<unsigned long long*>(s.first_bad.p);
  FEDWAN_CUDA_CHECK(kernels::launch_encode(m.codec->id(), args, s.stream.p));

  const size_t bytes = m.codec->encoded_size(n);
  if (bytes > 0) {
    FEDWAN_CUDA_CHECK(
        cudaMemcpyAsync(s.host.p, s.payload.p, bytes, cudaMemcpyDeviceToHost, s.stream.p));
  }
  FEDWAN_CUDA_CHECK(cudaMemcpyAsync(s.host_bad.p, s.first_bad.p, sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, s.stream.p));
  FEDWAN_CUDA_CHECK(cudaEventRecord(s.done.p, s.stream.p));
  s.in_flight = true;
  s.in = in;
  s.minus = minus;
  s.residual = residual;
  s.n = n;
}

DeviceEncoder::Encoded DeviceEncoder::wait(int slot) {
  Impl& m = *impl_;
  Slot& s = m.slot_at(slot);
  if (!s.in_flight) {
    throw ConfigError("DeviceEncoder: slot " + std::to_string(slot) + " has nothing in flight");
  }
  DeviceScope scope(m.options.device);
  const auto deadline = std::chrono::steady_clock::now() + m.options.timeout;
  // Spin briefly (a chunk takes tens of microseconds), then back off.
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    const cudaError_t status = cudaEventQuery(s.done.p);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) {
      s.in_flight = false;
      FEDWAN_CUDA_CHECK(status);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      // The slot stays in flight: a later wait() may still collect it.
      throw TimeoutError("DeviceEncoder: chunk of slot " + std::to_string(slot) +
                         " not encoded after " + std::to_string(m.options.timeout.count()) +
                         " ms; the GPU is stalled or oversubscribed");
    }
    if (pause.count() == 0) {
      std::this_thread::yield();
      pause = std::chrono::microseconds(10);
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
  s.in_flight = false;
  unsigned long long bad = kNoBad;
  std::memcpy(&bad, s.host_bad.p, sizeof bad);
  if (bad != kNoBad) m.throw_non_finite(s, bad);
  return Encoded{static_cast<const uint8_t*>(s.host.p), m.codec->encoded_size(s.n)};
}

std::vector<uint8_t> DeviceEncoder::encode(const float* in, float* residual, size_t n) {
  encode_async(0, in, residual, n);
  const Encoded e = wait(0);
  return std::vector<uint8_t>(e.data, e.data + e.size);
}

}  // namespace fedwan::cuda
