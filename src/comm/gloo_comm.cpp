// The Gloo engine of SiteComm: CPU ranks connected full mesh over TCP, met
// through a Gloo FileStore in the rendezvous directory. Every Gloo failure
// (a peer gone, a timeout) becomes a TransportError naming the operation.
// Built only where fedwan_core links the system's Gloo (comm/gloo_engine.hpp
// says when it does not).
#if FEDWAN_CORE_GLOO
#include <dlfcn.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include <atomic>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "comm/gloo_engine.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_comm.hpp"

namespace fedwan {
namespace {

std::atomic<comm::GlooEngine> g_engine{nullptr};

#if FEDWAN_CORE_GLOO
// The process must run Gloo's code from the library fedwan was compiled
// against. A LibTorch that carries its own Gloo, loaded before it, takes
// fedwan's calls instead, and Gloo's objects then differ in layout: a crash,
// not an error. Said here, before anything is called.
void check_gloo_is_ours() {
  void (*entry)(const gloo::AllreduceOptions&) = &gloo::allreduce;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(entry), &info) == 0 || info.dli_fname == nullptr) return;
  const std::string from = info.dli_fname;
  if (from.find("libgloo") != std::string::npos) return;
  throw ConfigError("site communicator: this fedwan was built against the system's Gloo, but "
                    "the process runs Gloo's code from " +
                    from +
                    " (a LibTorch that carries its own Gloo, such as the pip torch wheel): "
                    "rebuild fedwan against the LibTorch this program links");
}

class GlooComm final : public SiteComm {
 public:
  explicit GlooComm(const SiteCommOptions& o) : opt_(o) {
    comm::prepare_site_comm(o);
    check_gloo_is_ours();
    guard("joining the site", [&] {
      gloo::transport::tcp::attr attr;
      attr.hostname = o.hostname;
      device_ = gloo::transport::tcp::CreateDevice(attr);
      store_ = std::make_unique<gloo::rendezvous::FileStore>(o.rendezvous_dir);
      prefix_ = std::make_unique<gloo::rendezvous::PrefixStore>(o.name, *store_);
      context_ = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
      context_->setTimeout(o.timeout);
      context_->connectFullMesh(*prefix_, device_);
    });
    log().info("[comm:{}] rank {} of {} joined (gloo, {})", o.name, o.rank, o.size, o.hostname);
  }

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.size; }
  const char* engine() const override { return "gloo"; }

  void allreduce_sum(float* data, size_t n) override {
    if (opt_.size == 1 || n == 0) return;
    guard("allreduce", [&] {
      gloo::AllreduceOptions a(context_);
      a.setOutput(data, n);
      a.setReduceFunction([](void* c, const void* x, const void* y, size_t k) {
        auto* out = static_cast<float*>(c);
        const auto* l = static_cast<const float*>(x);
        const auto* r = static_cast<const float*>(y);
        for (size_t i = 0; i < k; ++i) out[i] = l[i] + r[i];
      });
      a.setTag(next_tag());
      a.setTimeout(opt_.timeout);
      gloo::allreduce(a);
    });
  }

  std::chrono::milliseconds timeout() const override { return opt_.timeout; }
  using SiteComm::broadcast;

  void broadcast(float* data, size_t n, int root, std::chrono::milliseconds timeout) override {
    comm::check_root(opt_, root);
    if (opt_.size == 1 || n == 0) return;
    guard("broadcast", [&] {
      gloo::BroadcastOptions b(context_);
      b.setOutput(data, n);
      b.setRoot(root);
      b.setTag(next_tag());
      b.setTimeout(timeout);
      gloo::broadcast(b);
    });
  }

  void barrier() override {
    if (opt_.size == 1) return;
    guard("barrier", [&] {
      gloo::BarrierOptions b(context_);
      b.setTag(next_tag());
      b.setTimeout(opt_.timeout);
      gloo::barrier(b);
    });
  }

 private:
  uint32_t next_tag() { return tag_++; }

  // Runs a Gloo call; any failure leaves the communicator broken.
  template <class F>
  void guard(const char* what, F&& f) {
    comm::guarded(opt_, broken_, what, std::forward<F>(f));
  }

  SiteCommOptions opt_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::unique_ptr<gloo::rendezvous::FileStore> store_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefix_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 1;
  bool broken_ = false;
};
#endif  // FEDWAN_CORE_GLOO

}  // namespace

namespace comm {

void install_gloo_engine(GlooEngine engine) { g_engine.store(engine); }

void prepare_site_comm(const SiteCommOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw ConfigError("site communicator: rank " + std::to_string(o.rank) + " of size " +
                      std::to_string(o.size) + " is not a rank of the site (0 .. size-1)");
  }
  if (o.rendezvous_dir.empty()) {
    throw ConfigError("site communicator: no rendezvous directory; give every rank of the "
                      "site the same directory they can all read and write");
  }
  if (o.timeout.count() <= 0) throw ConfigError("site communicator: timeout must be > 0");
  std::error_code ec;
  std::filesystem::create_directories(o.rendezvous_dir, ec);
  if (ec) {
    throw ConfigError("site communicator: cannot create rendezvous directory " + o.rendezvous_dir +
                      ": " + ec.message());
  }
}

std::string comm_failure(const SiteCommOptions& o, const char* what, const char* cause) {
  std::string first_line = cause;
  const size_t eol = first_line.find('\n');
  if (eol != std::string::npos) first_line.resize(eol);
  return "site communicator '" + o.name + "', rank " + std::to_string(o.rank) + " of " +
         std::to_string(o.size) + ": " + what + " failed (a rank died, or did not answer within " +
         std::to_string(o.timeout.count()) + " ms): " + first_line;
}

void check_root(const SiteCommOptions& o, int root) {
  if (root < 0 || root >= o.size) {
    throw ConfigError("broadcast from rank " + std::to_string(root) + ": the site has ranks 0.." +
                      std::to_string(o.size - 1));
  }
}

}  // namespace comm

void SiteComm::allreduce_mean(float* data, size_t n) {
  allreduce_sum(data, n);
  const float scale = 1.0f / static_cast<float>(size());
  for (size_t i = 0; i < n; ++i) data[i] *= scale;
}

void SiteComm::broadcast_bytes(std::vector<uint8_t>& bytes, int root,
                               std::chrono::milliseconds timeout) {
  // The length first, then the bytes carried in floats (copied, never
  // computed on, so every bit pattern survives).
  float length[2] = {0, 0};
  if (rank() == root) {
    const uint64_t n = bytes.size();
    length[0] = static_cast<float>(n & 0xffffff);
    length[1] = static_cast<float>(n >> 24);
  }
  broadcast(length, 2, root, timeout);
  const uint64_t n = static_cast<uint64_t>(length[0]) | (static_cast<uint64_t>(length[1]) << 24);
  std::vector<float> carrier((n + sizeof(float) - 1) / sizeof(float), 0.0f);
  if (rank() == root && n > 0) std::memcpy(carrier.data(), bytes.data(), n);
  broadcast(carrier.data(), carrier.size(), root, timeout);
  bytes.resize(n);
  if (n > 0) std::memcpy(bytes.data(), carrier.data(), n);
}

std::unique_ptr<SiteComm> make_gloo_comm(const SiteCommOptions& options) {
  if (comm::GlooEngine engine = g_engine.load()) return engine(options);
#if FEDWAN_CORE_GLOO
  return std::make_unique<GlooComm>(options);
#else
  comm::prepare_site_comm(options);
  throw ConfigError("site communicator: this fedwan runs Gloo through its LibTorch's c10d, and "
                    "the torch layer (libfedwan, target fedwan::fedwan) is not loaded in this "
                    "process: link it, and use one of its classes (Site, DataParallel)");
#endif
}

}  // namespace fedwan
