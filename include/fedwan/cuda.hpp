// The CUDA side of fedwan (library fedwan::cuda, built when a CUDA toolkit is
// found): device discovery, the NCCL engine of the site communicator, and
// the codecs' GPU encoders. No CUDA or NCCL type appears here; device
// pointers are plain pointers, streams are the device's own.
//
// Every function is safe to call on a machine without a GPU or driver:
// device_count() says 0 and the rest throw fedwan::ConfigError saying so.
#pragma once

#include "fedwan/export.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/site_comm.hpp"
#include "fedwan/site_core.hpp"

namespace fedwan::cuda {

// Number of usable CUDA devices; 0 without a GPU or driver. Thread safe.
FEDWAN_API int device_count();

// True when p points into memory of a CUDA device (cudaMalloc, managed);
// false for host memory, pinned host memory included, and without a GPU.
FEDWAN_API bool is_device_pointer(const void* p);

// ---- site communicator: the NCCL engine -----------------------------------

// NCCL over the site's GPUs, one rank per GPU. `bootstrap` is an already
// joined communicator of the same ranks (the Gloo engine, say): rank 0, the
// site leader, creates the ncclUniqueId and broadcasts it through it. Data
// pointers passed to the result must be device memory of `device`. Each call
// blocks until the collective is complete (at most options.timeout; then the
// NCCL communicator is aborted and a TransportError thrown, never a hang).
// Work the caller queued on the device's default stream before the call is
// done before the collective reads its data.
FEDWAN_API std::unique_ptr<SiteComm> make_nccl_comm(const SiteCommOptions& options,
                                                    SiteComm& bootstrap, int device);

// The communicator a site's ranks want when they may hold CUDA tensors: the
// Gloo engine for host memory and, with device >= 0, the NCCL engine for
// device memory, picked per call by where the data lives (is_device_pointer).
// engine() names the NCCL engine when it is there ("nccl+gloo"), else "gloo".
FEDWAN_API std::unique_ptr<SiteComm> make_site_comm(const SiteCommOptions& options, int device);

// ---- codecs on the GPU ------------------------------------------------------

struct FEDWAN_API DeviceEncoderOptions {
  int device = 0;
  std::string codec = "fp16";             // fp32, fp16, bf16 or int8
  size_t max_elements = size_t{1} << 20;  // the largest chunk encoded (sizes the buffers)
  int slots = 2;                          // chunks in flight, each with its own pinned buffer
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Encodes fp32 chunks that live in GPU memory, on the GPU, into exactly the
// bytes the CPU codec of the same name produces (bit for bit, error-feedback
// residual included), and copies only those bytes to pinned host memory, on
// a stream of its own. Thread safety: one thread drives an encoder.
class FEDWAN_API DeviceEncoder {
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
  // The same for (a - b), each difference rounded to fp32 before the
  // residual is added: the bytes the CPU codec gives for the host-computed
  // difference. a and b are n device floats each.
  void encode_difference_async(int slot, const float* a, const float* b, float* residual, size_t n);

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
  struct FEDWAN_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

// The UpdateEncoder (fedwan/site_core.hpp) of a site whose model lives on a
// CUDA device: sync() gets each chunk of (anchor - params) computed and
// encoded on the GPU in one pass, with the residual kept on the GPU, and
// only the encoded bytes copied to the host. fedwan::Site installs one for a
// CUDA model; install one yourself when driving a SiteCore over a model on a
// GPU (SiteOptions::update_encoder), and call set_anchor after every call
// that changes the round.
class FEDWAN_API DeviceUpdateEncoder final : public UpdateEncoder {
 public:
  // `params`: the live model, n floats of device memory on `device`, valid
  // for the encoder's life. `max_chunk_elements`: the topology's chunk size
  // in elements (ChunkPlan). Throws ConfigError without a GPU.
  DeviceUpdateEncoder(int device, const float* params, size_t n, size_t max_chunk_elements,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~DeviceUpdateEncoder() override;

  // Copies the round's anchor (n host floats: SiteCore::anchor()) to the GPU.
  void set_anchor(const float* host_anchor);

  void encode(const Codec& codec, uint64_t offset, uint32_t n, bool error_feedback,
              uint8_t* out) override;
  void read_residual(float* out, size_t n) override;
  void write_residual(const float* in, size_t n) override;

 private:
  struct FEDWAN_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedwan::cuda
