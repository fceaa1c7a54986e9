// The NCCL engine of SiteComm: one rank per GPU. Rank 0 creates the
// ncclUniqueId and hands it to the others over the bootstrap communicator;
// the NCCL communicator is non-blocking (ncclConfig_t.blocking = 0), so that
// joining and every collective can be polled against a deadline and aborted
// instead of hanging on a rank that died.
//
// Each collective runs on a stream of the communicator's own, after the work
// the caller queued on the device's legacy default stream (an event recorded
// there, waited on by our stream), and the call returns once it is complete.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "cuda_check.hpp"
#include "device_scope.hpp"
#include "fedwan/cuda.hpp"
#include "fedwan/error.hpp"

#ifdef FEDWAN_HAVE_NCCL
#include <nccl.h>
// Non-blocking communicators and ncclCommFinalize came with NCCL 2.14.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define FEDWAN_NCCL_ENGINE 1
#include "nccl_check.hpp"
#endif
#endif

namespace fedwan::cuda {

#ifdef FEDWAN_NCCL_ENGINE
namespace {

using Clock = std::chrono::steady_clock;

// Paces a polling loop: it spins (yielding the core) while the wait is
// short, so that a small collective returns within microseconds, then
// sleeps between polls, so that a long wait does not hold a core.
class Pacer {
 public:
  void pause() {
    if (Clock::now() - start_ < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
  }

 private:
  static constexpr std::chrono::milliseconds kSpin{2};
  static constexpr std::chrono::microseconds kSleep{50};
  Clock::time_point start_ = Clock::now();
};

std::string ms(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

class NcclComm final : public SiteComm {
 public:
  NcclComm(const SiteCommOptions& o, SiteComm& bootstrap, int device) : opt_(o), device_(device) {
    validate(bootstrap);
    DeviceScope scope(device_);
    try {
      FEDWAN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      FEDWAN_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
      FEDWAN_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      FEDWAN_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
      FEDWAN_CUDA_CHECK(cudaMemset(scratch_, 0, sizeof(float)));
      join(share_unique_id(bootstrap));
    } catch (...) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      release();
      throw;
    }
    int version = 0;
    ncclGetVersion(&version);
    log().info("[comm:{}] rank {} of {} joined (nccl {}, GPU {})", opt_.name, opt_.rank, opt_.size,
               version, device_);
  }

  ~NcclComm() override {
    // Never throws: a healthy communicator is finalized (bounded by the
    // timeout), a broken one, or one that does not finalize, aborted.
    int previous = -1;
    const bool scoped = cudaGetDevice(&previous) == cudaSuccess &&
                        (previous == device_ || cudaSetDevice(device_) == cudaSuccess);
    if (!scoped) cudaGetLastError();
    close();
    release();
    if (scoped && previous != device_) cudaSetDevice(previous);
  }

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.size; }
  const char* engine() const override { return "nccl"; }
  bool accepts_device_memory() const override { return true; }
  std::chrono::milliseconds timeout() const override { return opt_.timeout; }

  void allreduce_sum(float* data, size_t n) override { allreduce(data, n, ncclSum, "allreduce"); }
  void allreduce_mean(float* data, size_t n) override {
    allreduce(data, n, ncclAvg, "allreduce (mean)");
  }

  using SiteComm::broadcast;
  void broadcast(float* data, size_t n, int root, std::chrono::milliseconds timeout) override {
    usable();
    if (root < 0 || root >= opt_.size) {
      throw ConfigError("broadcast from rank " + std::to_string(root) + ": the site has ranks 0.." +
                        std::to_string(opt_.size - 1));
    }
    if (timeout.count() <= 0) throw ConfigError("broadcast: timeout must be > 0");
    if (n == 0) return;
    check_device_memory(data, "broadcast");
    run("broadcast", timeout, [&] {
      return FEDWAN_NCCL_CHECK_ASYNC(
          ncclBroadcast(data, data, n, ncclFloat32, root, comm_, stream_));
    });
  }

  void barrier() override {
    usable();
    run("barrier", opt_.timeout, [&] {
      return FEDWAN_NCCL_CHECK_ASYNC(
          ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    });
  }

 private:
  void validate(const SiteComm& bootstrap) const {
    if (opt_.size < 1 || opt_.rank < 0 || opt_.rank >= opt_.size) {
      throw ConfigError("site communicator (nccl): rank " + std::to_string(opt_.rank) +
                        " of size " + std::to_string(opt_.size) +
                        " is not a rank of the site (0 .. size-1)");
    }
    if (opt_.timeout.count() <= 0) {
      throw ConfigError("site communicator (nccl): timeout must be > 0");
    }
    if (bootstrap.rank() != opt_.rank || bootstrap.size() != opt_.size) {
      throw ConfigError("site communicator (nccl): the bootstrap communicator is rank " +
                        std::to_string(bootstrap.rank()) + " of " +
                        std::to_string(bootstrap.size()) + ", the options say rank " +
                        std::to_string(opt_.rank) + " of " + std::to_string(opt_.size) +
                        "; give make_nccl_comm the options its bootstrap was made with");
    }
    const int count = device_count();
    if (device_ < 0 || device_ >= count) {
      throw ConfigError(
          "site communicator (nccl): GPU " + std::to_string(device_) +
          " does not exist; this machine has " + std::to_string(count) +
          " CUDA device(s) (device_count())" +
          (count == 0 ? ": no GPU or no driver; run the rank on the CPU (Gloo)" : ""));
    }
  }

  // Rank 0 makes the id; every rank gets it over the bootstrap. A rank 0
  // that cannot make one sends nothing, so the others fail at once.
  ncclUniqueId share_unique_id(SiteComm& bootstrap) {
    std::vector<uint8_t> bytes;
    std::string failure;
    if (opt_.rank == 0) {
      ncclUniqueId id;
      try {
        FEDWAN_NCCL_CHECK(ncclGetUniqueId(&id));
        bytes.assign(id.internal, id.internal + NCCL_UNIQUE_ID_BYTES);
      } catch (const Error& e) {
        failure = e.what();
      }
    }
    bootstrap.broadcast_bytes(bytes, 0, opt_.timeout);
    if (!failure.empty()) {
      throw TransportError(where() + ": could not create the NCCL unique id: " + failure);
    }
    if (bytes.size() != NCCL_UNIQUE_ID_BYTES) {
      throw TransportError(where() + ": " +
                           (bytes.empty()
                                ? std::string("rank 0 (the site leader) could not create the NCCL "
                                              "unique id; its log says why")
                                : "rank 0 sent a " + std::to_string(bytes.size()) +
                                      "-byte NCCL id, not " + std::to_string(NCCL_UNIQUE_ID_BYTES) +
                                      ": do all ranks run the same fedwan and NCCL?"));
    }
    ncclUniqueId id;
    std::copy(bytes.begin(), bytes.end(), id.internal);
    return id;
  }

  // Joins the NCCL communicator in the background and polls it, so that a
  // rank that never comes costs the timeout, not a hang.
  void join(const ncclUniqueId& id) {
    const auto deadline = Clock::now() + opt_.timeout;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    bool ready = false;
    try {
      FEDWAN_NCCL_CHECK_ASYNC(ncclCommInitRankConfig(&comm_, opt_.size, id, opt_.rank, &config));
      ready = settle(deadline);
    } catch (const ConfigError& e) {
      abort("joining failed");
      throw ConfigError(where() + ": joining the NCCL communicator on GPU " +
                        std::to_string(device_) + ": " + e.what());
    } catch (const Error& e) {
      abort("joining failed");
      throw TransportError(where() + ": joining the NCCL communicator on GPU " +
                           std::to_string(device_) + " failed: " + e.what());
    }
    if (!ready) {
      abort("joining timed out");
      throw TransportError(where() + ": joining the NCCL communicator did not complete within " +
                           ms(opt_.timeout) +
                           " (a rank of the site did not join, or cannot reach this one over "
                           "the interface NCCL picked; NCCL_SOCKET_IFNAME chooses it)");
    }
  }

  // Polls until NCCL has finished what it does in the background (joining,
  // enqueueing, finalizing). False at the deadline; throws NCCL's error.
  bool settle(Clock::time_point deadline) {
    Pacer pacer;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      FEDWAN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return true;
      detail::check_nccl(state, true, "the NCCL communicator", __FILE__, __LINE__);
      if (Clock::now() >= deadline) return false;
      pacer.pause();
    }
  }

  void allreduce(float* data, size_t n, ncclRedOp_t op, const char* what) {
    usable();
    if (n == 0) return;
    check_device_memory(data, what);
    run(what, opt_.timeout, [&] {
      return FEDWAN_NCCL_CHECK_ASYNC(ncclAllReduce(data, data, n, ncclFloat32, op, comm_, stream_));
    });
  }

  // Launches one collective after the caller's queued work and waits for it.
  // Any failure, or the deadline, aborts the communicator for good.
  template <class Launch>
  void run(const char* what, std::chrono::milliseconds timeout, Launch&& launch) {
    const auto deadline = Clock::now() + timeout;
    try {
      DeviceScope scope(device_);
      FEDWAN_CUDA_CHECK(cudaEventRecord(inputs_ready_, cudaStreamLegacy));
      FEDWAN_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
      // In progress: NCCL is still enqueueing; nothing may be queued behind
      // it (our completion event included) before it is done.
      if (launch() == ncclInProgress && !settle(deadline)) timed_out(what, timeout);
      FEDWAN_CUDA_CHECK(cudaEventRecord(done_, stream_));
      Pacer pacer;
      for (;;) {
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) FEDWAN_CUDA_CHECK(q);
        ncclResult_t state = ncclSuccess;
        FEDWAN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
        detail::check_nccl(state, true, "the NCCL communicator", __FILE__, __LINE__);
        if (Clock::now() >= deadline) timed_out(what, timeout);
        pacer.pause();
      }
    } catch (const TimedOut&) {
      // failure_ says what.
    } catch (const Error& e) {
      abort(std::string(what) + " failed on GPU " + std::to_string(device_) + ": " + e.what());
    }
    throw TransportError(where() + ": " + failure_ +
                         "; the NCCL communicator was aborted: restart the site");
  }

  struct TimedOut {};
  [[noreturn]] void timed_out(const char* what, std::chrono::milliseconds timeout) {
    abort(std::string(what) + " did not complete within " + ms(timeout) +
          " (a rank died, stalled or never called it)");
    throw TimedOut{};
  }

  // Every later call fails once the communicator broke.
  void usable() const {
    if (broken_) {
      throw TransportError(where() + ": unusable after an earlier failure (" + failure_ +
                           "); restart the site");
    }
  }

  void check_device_memory(const void* data, const char* what) const {
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, data);
    if (e != cudaSuccess) cudaGetLastError();
    const bool ours =
        e == cudaSuccess && ((a.type == cudaMemoryTypeDevice && a.device == device_) ||
                             a.type == cudaMemoryTypeManaged);
    if (ours) return;
    std::string is = "not CUDA memory";
    if (e == cudaSuccess && a.type == cudaMemoryTypeDevice) {
      is = "memory of GPU " + std::to_string(a.device);
    } else if (e == cudaSuccess && a.type == cudaMemoryTypeHost) {
      is = "pinned host memory";
    } else if (e == cudaSuccess && a.type == cudaMemoryTypeUnregistered) {
      is = "host memory";
    }
    throw ConfigError(where() + ": " + what + " of " + is +
                      "; the NCCL engine takes memory of GPU " + std::to_string(device_) +
                      " only (fedwan::cuda::make_site_comm routes host data to the Gloo engine)");
  }

  std::string where() const {
    return "site communicator '" + opt_.name + "' (nccl), rank " + std::to_string(opt_.rank) +
           " of " + std::to_string(opt_.size);
  }

  // Marks the communicator broken for good and aborts it: NCCL's kernels
  // and threads stop, whatever they wait for.
  void abort(const std::string& reason) {
    broken_ = true;
    failure_ = reason;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Destructor only.
  void close() noexcept {
    if (comm_ == nullptr) return;
    if (!broken_) {
      try {
        if (FEDWAN_NCCL_CHECK_ASYNC(ncclCommFinalize(comm_)) == ncclSuccess ||
            settle(Clock::now() + opt_.timeout)) {
          ncclCommDestroy(comm_);
          comm_ = nullptr;
          return;
        }
        log().warn("{}: finalizing did not complete within {}; aborting", where(),
                   ms(opt_.timeout));
      } catch (const std::exception& e) {
        log().warn("{}: finalizing failed ({}); aborting", where(), e.what());
      }
    }
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void release() noexcept {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    scratch_ = nullptr;
    done_ = inputs_ready_ = nullptr;
    stream_ = nullptr;
    cudaGetLastError();
  }

  SiteCommOptions opt_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;  // recorded on the legacy default stream
  cudaEvent_t done_ = nullptr;          // recorded on stream_ after the collective
  float* scratch_ = nullptr;            // one device float: the barrier's payload
  bool broken_ = false;
  std::string failure_;
};

}  // namespace
#endif  // FEDWAN_NCCL_ENGINE

std::unique_ptr<SiteComm> make_nccl_comm(const SiteCommOptions& options, SiteComm& bootstrap,
                                         int device) {
#ifdef FEDWAN_NCCL_ENGINE
  return std::make_unique<NcclComm>(options, bootstrap, device);
#else
  (void)options;
  (void)bootstrap;
  (void)device;
  throw ConfigError(
      "site communicator: this fedwan was built without NCCL (2.14 or newer), so it has no NCCL "
      "engine; rebuild with NCCL installed (the CUDA toolkit's, or libnccl-dev), or run the "
      "site's ranks on the CPU (the Gloo engine)");
#endif
}

}  // namespace fedwan::cuda
