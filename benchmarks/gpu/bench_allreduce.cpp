// Bucketed gradient allreduce on GPUs against one plain allreduce of the same
// bytes, measured in the same run: ranks as threads, one GPU each, over the
// NCCL engine (fedwan::cuda::make_site_comm). For B in {25, 100, 400} MiB:
//   nccl     one ncclAllReduce of B bytes straight on NCCL (communicators
//            from ncclCommInitAll, a stream of each rank's own): the baseline
//            every ratio is taken against (built with NCCL's headers);
//   raw      one allreduce of B bytes through fedwan's engine
//            (SiteComm::allreduce_sum: ncclAllReduce plus the engine's stream
//            ordering and polling);
//   chunked  the same B bytes as 25 MiB allreduces, one after the other (the
//            bucketing alone);
//   dp       DataParallel::synchronize() over a module whose parameters total
//            B bytes, gradients filled, 25 MiB buckets (bucketing plus the
//            copies into the buckets and back into .grad).
// Each is timed per iteration from a common start (a 1-float allreduce) to
// completion on every rank (the slowest rank's time counts), after warmup;
// the median is reported with the algorithm bandwidth B / time and the
// bandwidth ratio against the baseline (target >= 0.9); without NCCL's
// headers the baseline is the engine's single allreduce.
//
// Every GPU is a rank by default. With one GPU it runs one rank: no
// collective then, only what the engine and DataParallel add around one.
// Skips with a message, exit 0, without a GPU.
//   fedwan_gpu_bench_allreduce [--ranks N] [--iters N] [--warmup N] [--sizes-mib 25,100,400]
#include <cuda_runtime.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"

#ifdef FEDWAN_BENCH_WITH_NCCL
#include <nccl.h>
#endif

#ifdef FEDWAN_BENCH_WITH_TORCH
#include <torch/cuda.h>
#include <torch/torch.h>

#include "fedwan/data_parallel.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kBucketBytes = 25 * kMiB;

struct Settings {
  int ranks = 0;  // 0: every GPU
  int iters = 20;
  int warmup = 5;
  std::vector<size_t> sizes_mib = {25, 100, 400};
};

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--ranks" && has_value) {
      s.ranks = std::atoi(argv[++i]);
    } else if (a == "--iters" && has_value) {
      s.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has_value) {
      s.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--sizes-mib" && has_value) {
      s.sizes_mib.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) {
        const long v = std::atol(item.c_str());
        if (v > 0) s.sizes_mib.push_back(static_cast<size_t>(v));
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--iters N] [--warmup N] [--sizes-mib 25,100,400]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return s;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw fedwan::Error(std::string(what) + " failed: " + cudaGetErrorString(e));
  }
}

// Device floats of the calling thread's GPU.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    check(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    check(cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(float)), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() { return p_; }
  size_t size() const { return n_; }

 private:
  float* p_ = nullptr;
  size_t n_;
};

// Milliseconds of each timed iteration of `op`, each started together with
// the other ranks by `align` and ended when the device is idle.
std::vector<double> measure(const Settings& s, const std::function<void()>& align,
                            const std::function<void()>& op) {
  for (int i = 0; i < s.warmup; ++i) op();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<double> ms;
  for (int i = 0; i < s.iters; ++i) {
    align();
    const auto t0 = Clock::now();
    op();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return ms;
}

#ifdef FEDWAN_BENCH_WITH_TORCH
// A module whose trainable parameters total `bytes` (4 MiB tensors), on `device`.
struct Blob : torch::nn::Module {
  Blob(size_t bytes, torch::Device device) {
    const int64_t per = static_cast<int64_t>(4 * kMiB / sizeof(float));
    int64_t left = static_cast<int64_t>(bytes / sizeof(float));
    for (int k = 0; left > 0; ++k) {
      const int64_t n = std::min(per, left);
      torch::Tensor p = register_parameter(
          "p" + std::to_string(k), torch::zeros({n}, torch::TensorOptions().device(device)));
      p.mutable_grad() = torch::ones({n}, torch::TensorOptions().device(device));
      left -= n;
    }
  }
};
#endif

// Per size, per variant: each rank's milliseconds per iteration.
struct Row {
  std::vector<std::vector<double>> nccl, raw, chunked, dp;  // [rank][iteration]
};

#ifdef FEDWAN_BENCH_WITH_NCCL
using RawComm = ncclComm_t;
#else
using RawComm = void*;
#endif

void rank_main(int rank, int ranks, const Settings& s, const std::string& rendezvous,
               std::vector<Row>& rows, std::mutex& mu, bool with_dp, RawComm raw_comm) {
  check(cudaSetDevice(rank), "cudaSetDevice");
  fedwan::SiteCommOptions o;
  o.rank = rank;
  o.size = ranks;
  o.rendezvous_dir = rendezvous;
  o.name = "bench-allreduce";
  o.timeout = std::chrono::seconds(120);
  std::unique_ptr<fedwan::SiteComm> comm = fedwan::cuda::make_site_comm(o, rank);
  DeviceBuffer one(1);
  const auto align = [&] { comm->allreduce_sum(one.get(), 1); };
  for (size_t k = 0; k < s.sizes_mib.size(); ++k) {
    const size_t bytes = s.sizes_mib[k] * kMiB;
    std::vector<double> nccl, raw, chunked, dp;
    {
      DeviceBuffer buf(bytes / sizeof(float));
#ifdef FEDWAN_BENCH_WITH_NCCL
      cudaStream_t stream{};
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      nccl = measure(s, align, [&] {
        const ncclResult_t r =
            ncclAllReduce(buf.get(), buf.get(), buf.size(), ncclFloat32, ncclSum, raw_comm, stream);
        if (r != ncclSuccess)
          throw fedwan::Error(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      cudaStreamDestroy(stream);
#else
      (void)raw_comm;
#endif
      raw = measure(s, align, [&] { comm->allreduce_sum(buf.get(), buf.size()); });
      chunked = measure(s, align, [&] {
        const size_t step = kBucketBytes / sizeof(float);
        for (size_t off = 0; off < buf.size(); off += step) {
          comm->allreduce_sum(buf.get() + off, std::min(step, buf.size() - off));
        }
      });
    }
#ifdef FEDWAN_BENCH_WITH_TORCH
    if (with_dp) {
      const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
      Blob blob(bytes, device);
      fedwan::DataParallelOptions dpo;
      dpo.bucket_bytes = kBucketBytes;
      dpo.overlap = false;  // gradients are already there: synchronize() does it all
      fedwan::DataParallel parallel(blob, *comm, dpo);
      dp = measure(s, align, [&] { parallel.synchronize(); });
    }
#else
    (void)with_dp;
#endif
    std::lock_guard<std::mutex> lock(mu);
    rows[k].nccl[rank] = std::move(nccl);
    rows[k].raw[rank] = std::move(raw);
    rows[k].chunked[rank] = std::move(chunked);
    rows[k].dp[rank] = std::move(dp);
  }
}

// Median over iterations of the slowest rank's time.
double median_of_slowest(const std::vector<std::vector<double>>& per_rank) {
  if (per_rank.empty() || per_rank[0].empty()) return 0.0;
  std::vector<double> slowest(per_rank[0].size(), 0.0);
  for (const auto& r : per_rank) {
    for (size_t i = 0; i < slowest.size() && i < r.size(); ++i) {
      slowest[i] = std::max(slowest[i], r[i]);
    }
  }
  std::sort(slowest.begin(), slowest.end());
  const size_t m = slowest.size() / 2;
  return slowest.size() % 2 ? slowest[m] : (slowest[m - 1] + slowest[m]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse(argc, argv);
  const int gpus = fedwan::cuda::device_count();
  if (gpus < 1) {
    std::printf("bench_allreduce: skipped: no CUDA device on this machine\n");
    return 0;
  }
  if (s.ranks > gpus) {
    std::printf("bench_allreduce: skipped: %d ranks asked for, this machine has %d GPU(s)\n",
                s.ranks, gpus);
    return 0;
  }
  const int ranks = s.ranks > 0 ? s.ranks : gpus;
  if (ranks == 1) {
    std::printf("bench_allreduce: one rank on one GPU: no collective runs; the rows measure what "
                "the engine and DataParallel add around one (NCCL's one-rank allreduce, the "
                "engine's calls, the bucket copies)\n");
  }
  bool with_dp = false;
#ifdef FEDWAN_BENCH_WITH_TORCH
  with_dp = torch::cuda::is_available() && static_cast<int>(torch::cuda::device_count()) >= ranks;
  if (!with_dp) std::printf("bench_allreduce: DataParallel rows skipped: LibTorch has no CUDA\n");
#else
  std::printf("bench_allreduce: DataParallel rows skipped: built without LibTorch\n");
#endif

  std::string tmpl = (std::filesystem::temp_directory_path() / "fedwan-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "bench_allreduce: cannot create a temporary directory\n");
    return 1;
  }
  std::vector<Row> rows(s.sizes_mib.size());
  for (Row& r : rows) {
    r.nccl.resize(ranks);
    r.raw.resize(ranks);
    r.chunked.resize(ranks);
    r.dp.resize(ranks);
  }
  std::vector<RawComm> raw_comms(static_cast<size_t>(ranks), nullptr);
#ifdef FEDWAN_BENCH_WITH_NCCL
  {
    std::vector<int> devices(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devices[static_cast<size_t>(r)] = r;
    const ncclResult_t res = ncclCommInitAll(raw_comms.data(), ranks, devices.data());
    if (res != ncclSuccess) {
      std::fprintf(stderr, "bench_allreduce: ncclCommInitAll: %s\n", ncclGetErrorString(res));
      return 1;
    }
  }
#endif
  std::mutex mu;
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        rank_main(r, ranks, s, tmpl, rows, mu, with_dp, raw_comms[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
#ifdef FEDWAN_BENCH_WITH_NCCL
  for (RawComm c : raw_comms) ncclCommDestroy(c);
#endif
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  bool failed = false;
  for (int r = 0; r < ranks; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "bench_allreduce: rank %d failed: %s\n", r, errors[r].c_str());
      failed = true;
    }
  }
  if (failed) return 1;

  std::printf("bench_allreduce: %d ranks (one GPU each), %d iterations after %d warmup, "
              "median of the slowest rank; buckets/chunks of 25 MiB; bw = bytes / time\n",
              ranks, s.iters, s.warmup);
  std::printf("%8s | %9s %9s | %9s %9s %7s | %9s %9s %7s | %9s %9s %7s\n", "size", "nccl ms",
              "GB/s", "raw ms", "GB/s", "ratio", "chunk ms", "GB/s", "ratio", "dp ms", "GB/s",
              "ratio");
  for (size_t k = 0; k < rows.size(); ++k) {
    const double bytes = static_cast<double>(s.sizes_mib[k] * kMiB);
    const double raw = median_of_slowest(rows[k].raw);
    const double nccl = median_of_slowest(rows[k].nccl);
    const double base = nccl > 0 ? nccl : raw;  // the baseline of every ratio
    const double chunk = median_of_slowest(rows[k].chunked);
    const double dp = median_of_slowest(rows[k].dp);
    auto gbps = [&](double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0; };
    char dp_cols[64] = "      n/a       n/a     n/a";
    if (dp > 0)
      std::snprintf(dp_cols, sizeof dp_cols, "%9.3f %9.1f %7.3f", dp, gbps(dp), base / dp);
    std::printf("%4zu MiB | %9.3f %9.1f | %9.3f %9.1f %7.3f | %9.3f %9.1f %7.3f | %s\n",
                s.sizes_mib[k], nccl, gbps(nccl), raw, gbps(raw), base / raw, chunk, gbps(chunk),
                base / chunk, dp_cols);
  }
  std::printf("ratio = baseline time / this time (bandwidth over the baseline's): the baseline "
              "is %s; target >= 0.9 for chunk and dp\n",
              rows.empty() || median_of_slowest(rows[0].nccl) > 0
                  ? "one ncclAllReduce straight on NCCL"
                  : "the engine's single allreduce (built without NCCL's headers)");
  return 0;
}
