// GPU codec throughput against the device's own memcpy, measured in the same
// run on the same chunk (docs/benchmarks.md explains the ratios):
//
//   kernel ratio   = time of a device-to-device copy of the fp32 chunk
//                    / time of the encoding kernels on it (both on the GPU);
//                    1.0 means the codec encodes as fast as the GPU copies.
//   traffic ratio  = bytes the kernels move per second / bytes the copy
//                    moves per second: how close to the memory roofline the
//                    kernels run (error feedback reads and writes the
//                    residual, so it moves more bytes per element).
//   to-host ratio  = time to copy the fp32 chunk to pinned host memory
//                    / time of DeviceEncoder (kernels + copying only the
//                    encoded bytes to pinned memory + waiting): what a GPU
//                    site gains over copying fp32 to the host to encode it.
//
// Usage: fedwan_gpu_bench_device_codec [--device D] [--reps R]
// Exits 0 with a "skipped" line on a machine without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec_kernels.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/cuda.hpp"

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

struct Timer {
  cudaEvent_t start{}, stop{};
  Timer() {
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

// Median over reps of what `body` queues on `stream`, in seconds.
template <class F>
double median_seconds(int reps, cudaStream_t stream, F&& body) {
  Timer t;
  for (int i = 0; i < 3; ++i) body();  // warm-up
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(t.start, stream), "cudaEventRecord");
    body();
    check(cudaEventRecord(t.stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(t.stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, t.start, t.stop), "cudaEventElapsedTime");
    s.push_back(double(ms) / 1e3);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

template <class F>
double median_wall_seconds(int reps, F&& body) {
  for (int i = 0; i < 3; ++i) body();
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0) device = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  const int devices = fedwan::cuda::device_count();
  if (devices == 0) {
    std::printf("skipped: no CUDA device on this machine\n");
    return 0;
  }
  if (device < 0 || device >= devices) {
    std::fprintf(stderr, "--device %d: this machine has %d CUDA device(s)\n", device, devices);
    return 2;
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("device %d: %s, %d SMs, L2 %d MiB; median of %d runs\n", device, prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, reps);
  std::printf("%-5s %-3s %9s %11s %12s %12s %12s %10s %10s\n", "codec", "ef", "chunk_MiB",
              "copy_GB/s", "encode_GB/s", "kernel_ratio", "traffic_ratio", "d2h_GB/s",
              "host_ratio");

  cudaStream_t stream{};
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (size_t mib : {size_t{1}, size_t{4}, size_t{16}, size_t{64}}) {
    const size_t n = mib * (size_t{1} << 20) / sizeof(float);
    std::vector<float> host(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1e-3f);
    for (float& x : host) x = d(rng);

    float *in = nullptr, *copy = nullptr, *residual = nullptr;
    uint8_t* out = nullptr;
    uint32_t* block_max = nullptr;
    unsigned long long* first_bad = nullptr;
    void* pinned = nullptr;
    check(cudaMalloc(&in, n * 4), "cudaMalloc");
    check(cudaMalloc(&copy, n * 4), "cudaMalloc");
    check(cudaMalloc(&residual, n * 4), "cudaMalloc");
    check(cudaMalloc(&out, n * 4 + 4096), "cudaMalloc");
    check(cudaMalloc(&block_max, (n / 256 + 1) * 4), "cudaMalloc");
    check(cudaMalloc(&first_bad, 8), "cudaMalloc");
    check(cudaMallocHost(&pinned, n * 4), "cudaMallocHost");
    check(cudaMemcpy(in, host.data(), n * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemset(residual, 0, n * 4), "cudaMemset");

    const double t_copy = median_seconds(reps, stream, [&] {
      check(cudaMemcpyAsync(copy, in, n * 4, cudaMemcpyDeviceToDevice, stream), "copy");
    });
    const double t_to_host = median_seconds(reps, stream, [&] {
      check(cudaMemcpyAsync(pinned, in, n * 4, cudaMemcpyDeviceToHost, stream), "copy");
    });
    for (const char* name : {"fp32", "fp16", "bf16", "int8"}) {
      const fedwan::Codec& codec = fedwan::codec_by_name(name);
      const size_t encoded = codec.encoded_size(n);
      for (bool ef : {false, true}) {
        fedwan::cuda::kernels::EncodeArgs a;
        a.in = in;
        a.residual = ef ? residual : nullptr;
        a.n = n;
        a.out = out;
        a.block_max = block_max;
        a.first_bad = first_bad;
        const double t_kernels = median_seconds(reps, stream, [&] {
          check(cudaMemsetAsync(first_bad, 0xFF, 8, stream), "cudaMemsetAsync");
          check(fedwan::cuda::kernels::launch_encode(codec.id(), a, stream), "encode");
        });
        // Bytes the kernels move: the input (and the residual) read once
        // without a residual and twice with one, the payload (and the
        // residual) written.
        const int reads = fedwan::cuda::kernels::input_reads(ef);
        const double moved = double(n) * 4 * (ef ? 2 * reads + 1 : reads) + double(encoded);
        fedwan::cuda::DeviceEncoderOptions o;
        o.device = device;
        o.codec = name;
        o.max_elements = n;
        fedwan::cuda::DeviceEncoder encoder(o);
        const double t_encoder = median_wall_seconds(reps, [&] {
          encoder.encode_async(0, in, ef ? residual : nullptr, n);
          encoder.wait(0);
        });
        const double copy_bw = 2.0 * double(n) * 4 / t_copy;  // read + write
        std::printf("%-5s %-3s %9zu %11.1f %12.1f %12.2f %12.2f %10.2f %10.2f\n", name,
                    ef ? "yes" : "no", mib, copy_bw / 1e9, double(n) * 4 / t_kernels / 1e9,
                    t_copy / t_kernels, (moved / t_kernels) / copy_bw,
                    double(n) * 4 / t_to_host / 1e9, t_to_host / t_encoder);
      }
    }
    cudaFree(in);
    cudaFree(copy);
    cudaFree(residual);
    cudaFree(out);
    cudaFree(block_max);
    cudaFree(first_bad);
    cudaFreeHost(pinned);
  }
  cudaStreamDestroy(stream);
  return 0;
}
