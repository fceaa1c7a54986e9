// DeviceUpdateEncoder: SiteCore's update of a model on a GPU. The anchor and
// the residual live next to the parameters; each chunk of (anchor - params)
// goes through DeviceEncoder's fused difference kernels, and only its
// encoded bytes come back to the host. One chunk is in flight at a time:
// SiteCore seals and sends chunk i on its own threads while it asks for
// chunk i+1, and a chunk's kernels take microseconds.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>

#include "cuda_check.hpp"
#include "device_scope.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"

namespace fedwan::cuda {
namespace {

struct DeviceFree {
  void operator()(float* p) const { cudaFree(p); }
};
using DeviceArray = std::unique_ptr<float, DeviceFree>;

DeviceArray device_array(size_t n) {
  void* p = nullptr;
  FEDWAN_CUDA_CHECK(cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(float)));
  FEDWAN_CUDA_CHECK(cudaMemset(p, 0, (n > 0 ? n : 1) * sizeof(float)));
  return DeviceArray(static_cast<float*>(p));
}

}  // namespace

struct DeviceUpdateEncoder::Impl {
  int device = 0;
  const float* params = nullptr;
  size_t n = 0;
  size_t max_chunk = 0;
  std::chrono::milliseconds timeout{0};
  DeviceArray anchor;
  DeviceArray residual;
  // One encoder per codec the federation uses (it names one; a second
  // would only appear if the topology changed, which it cannot mid-run).
  std::unique_ptr<DeviceEncoder> encoder;
  CodecId encoder_codec = CodecId::kFp32;  // what `encoder` encodes, when there is one

  DeviceEncoder& encoder_for(const Codec& codec) {
    if (!encoder || encoder_codec != codec.id()) {
      DeviceEncoderOptions o;
      o.device = device;
      o.codec = std::string(codec.name());
      o.max_elements = max_chunk;
      o.slots = 1;
      o.timeout = timeout;
      encoder = std::make_unique<DeviceEncoder>(o);
      encoder_codec = codec.id();
    }
    return *encoder;
  }

  void check_range(size_t count, const char* what) const {
    if (count != n) {
      throw ConfigError(std::string("DeviceUpdateEncoder: ") + what + " of " +
                        std::to_string(count) + " floats for a model of " + std::to_string(n));
    }
  }
};

DeviceUpdateEncoder::DeviceUpdateEncoder(int device, const float* params, size_t n,
                                         size_t max_chunk_elements,
                                         std::chrono::milliseconds timeout)
    : impl_(new Impl) {
  const int devices = device_count();
  if (devices == 0) {
    throw ConfigError("DeviceUpdateEncoder: no CUDA device on this machine");
  }
  if (device < 0 || device >= devices) {
    throw ConfigError("DeviceUpdateEncoder: device " + std::to_string(device) +
                      " does not exist (this machine has " + std::to_string(devices) + ")");
  }
  if (n == 0 || max_chunk_elements == 0) {
    throw ConfigError("DeviceUpdateEncoder: an empty model or chunk size");
  }
  if (!is_device_pointer(params)) {
    throw ConfigError("DeviceUpdateEncoder: the parameters are not GPU memory");
  }
  Impl& m = *impl_;
  m.device = device;
  m.params = params;
  m.n = n;
  m.max_chunk = max_chunk_elements < n ? max_chunk_elements : n;
  m.timeout = timeout;
  DeviceScope scope(device);
  m.anchor = device_array(n);
  m.residual = device_array(n);
  FEDWAN_CUDA_CHECK(
      cudaMemcpy(m.anchor.get(), params, n * sizeof(float), cudaMemcpyDeviceToDevice));
}

DeviceUpdateEncoder::~DeviceUpdateEncoder() = default;

void DeviceUpdateEncoder::set_anchor(const float* host_anchor) {
  DeviceScope scope(impl_->device);
  FEDWAN_CUDA_CHECK(cudaMemcpy(impl_->anchor.get(), host_anchor, impl_->n * sizeof(float),
                               cudaMemcpyHostToDevice));
}

void DeviceUpdateEncoder::encode(const Codec& codec, uint64_t offset, uint32_t n,
                                 bool error_feedback, uint8_t* out) {
  Impl& m = *impl_;
  if (offset > m.n || n > m.n - offset) {
    throw ConfigError("DeviceUpdateEncoder: chunk [" + std::to_string(offset) + ", +" +
                      std::to_string(n) + ") outside a model of " + std::to_string(m.n));
  }
  DeviceEncoder& e = m.encoder_for(codec);
  e.encode_difference_async(0, m.anchor.get() + offset, m.params + offset,
                            error_feedback ? m.residual.get() + offset : nullptr, n);
  const DeviceEncoder::Encoded encoded = e.wait(0);
  std::memcpy(out, encoded.data, encoded.size);
}

void DeviceUpdateEncoder::read_residual(float* out, size_t n) {
  impl_->check_range(n, "read_residual");
  DeviceScope scope(impl_->device);
  FEDWAN_CUDA_CHECK(
      cudaMemcpy(out, impl_->residual.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
}

void DeviceUpdateEncoder::write_residual(const float* in, size_t n) {
  impl_->check_range(n, "write_residual");
  DeviceScope scope(impl_->device);
  FEDWAN_CUDA_CHECK(
      cudaMemcpy(impl_->residual.get(), in, n * sizeof(float), cudaMemcpyHostToDevice));
}

}  // namespace fedwan::cuda
