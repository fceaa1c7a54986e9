// The CUDA side of fedwan (library fedwan::cuda, built when a CUDA toolkit is
// found): device discovery, the NCCL engine of the site communicator, and
// the codecs' GPU encoders. No CUDA or NCCL type appears here; device
// pointers are plain pointers, streams are the device's own.
//
// Every function is safe to call on a machine without a GPU or driver:
// device_count() says 0 and the rest throw fedwan::ConfigError saying so.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/site_comm.hpp"

namespace fedwan::cuda {

// Number of usable CUDA devices; 0 without a GPU or driver. Thread safe.
int device_count();

// True when p points into memory of a CUDA device (cudaMalloc, managed);
// false for host memory, pinned host memory included, and without a GPU.
bool is_device_pointer(const void* p);

// ---- site communicator: the NCCL engine -----------------------------------

// NCCL over the site's GPUs, one rank per GPU. `bootstrap` is an already
// joined communicator of the same ranks (the Gloo engine, say): rank 0, the
// site leader, creates the ncclUniqueId and broadcasts it through it. Data
// pointers passed to the result must be device memory of `device`. Each call
// blocks until the collective is complete (at most options.timeout; then the
// NCCL communicator is aborted and a TransportError thrown, never a hang).
// Work the caller queued on the device's default stream before the call is
// done before the collective reads its data.
std::unique_ptr<SiteComm> make_nccl_comm(const SiteCommOptions& options, SiteComm& bootstrap,
                                         int device);

// The communicator a site's ranks want when they may hold CUDA tensors: the
// Gloo engine for host memory and, with device >= 0, the NCCL engine for
// device memory, picked per call by where the data lives (is_device_pointer).
// engine() names the NCCL engine when it is there ("nccl+gloo"), else "gloo".
std::unique_ptr<SiteComm> make_site_comm(const SiteCommOptions& options, int device);

// ---- codecs on the GPU ------------------------------------------------------

struct DeviceEncoderOptions {
  int device = 0;
  std::string codec = "fp16";            // fp32, fp16, bf16 or int8
  size_t max_elements = size_t{1} << 20;  // the largest chunk encoded (sizes the buffers)
  int slots = 2;                          // chunks in flight, each with its own pinned buffer
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Encodes fp32 chunks that live in GPU memory, on the GPU, into exactly the
// bytes the CPU codec of the same name produces (bit for bit, error-feedback
// residual included), and copies only those bytes to pinned host memory, on
// a stream of its own. Thread safety: one thread drives an encoder.
class DeviceEncoder {
 public:
  explicit DeviceEncoder(const DeviceEncoderOptions& options);
  ~DeviceEncoder();
  DeviceEncoder(const DeviceEncoder&) = delete;
  DeviceEncoder& operator=(const DeviceEncoder&) = delete;

  const std::string& codec() const;
  int slots() const;
  size_t encoded_size(size_t n) const;

  // Queues the encoding of n floats at device pointer `in` (plus `residual`,
  // n device floats updated in place with what the encoding lost; may be
  // null) into `slot`, and returns at once. in and residual must stay valid
  // and unwritten until wait(slot). Work queued on the device's default
  // stream before this call is done before the encoder reads them. Throws
  // ConfigError for n > max_elements, a bad slot, or a slot still in flight.
  void encode_async(int slot, const float* in, float* residual, size_t n);

  struct Encoded {
    const uint8_t* data = nullptr;  // pinned host memory, valid until the slot is reused
    size_t size = 0;
  };
  // Waits for the slot's chunk. Throws fedwan::Error when the input held a
  // non-finite value (the residual is then untouched, as with the CPU
  // codecs), TimeoutError after options.timeout.
  Encoded wait(int slot);

  // encode_async + wait on slot 0, copied out.
  std::vector<uint8_t> encode(const float* in, float* residual, size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan::cuda
