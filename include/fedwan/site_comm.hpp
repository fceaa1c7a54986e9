// The collective operations a site's ranks run among themselves (averaging
// gradients every step, broadcasting the site's model after an outer sync):
// one interface, with an engine per device kind. Gloo runs the ranks of a
// CPU site over TCP; the NCCL engine for CUDA ranks shares this interface.
//
// Ranks meet through a rendezvous directory that every rank of the site can
// read and write (a local directory for ranks on one machine, a shared file
// system across machines): each rank publishes its address there, then all
// connect to all.
//
// Errors: a rank that does not join, dies or stops answering makes the
// others fail with a TransportError naming the operation and the timeout
// (never a hang); bad options are a ConfigError. After an error the
// communicator is unusable: the site must be restarted.
// Thread safety: one communicator per rank, used by one thread at a time.
#pragma once

#include "fedwan/export.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace fedwan {

struct FEDWAN_API SiteCommOptions {
  int rank = 0;  // 0 .. size-1; rank 0 is the site leader
  int size = 1;  // ranks in the site
  // Directory the ranks rendezvous in (created if missing). Use a fresh one
  // per run of the site: addresses left by an earlier run would be taken
  // for live ranks.
  std::string rendezvous_dir;
  // Names this communicator within the directory (e.g. the site's node id),
  // so several sites or runs can share one directory.
  std::string name = "site";
  // Address this rank listens on for the other ranks of its site.
  std::string hostname = "127.0.0.1";
  // Longest wait for the other ranks: to join, and in each operation.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

class FEDWAN_API SiteComm {
 public:
  virtual ~SiteComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* engine() const = 0;  // "gloo", "nccl"

  // In place, on every rank: data[i] = sum over ranks of data[i].
  virtual void allreduce_sum(float* data, size_t n) = 0;
  // In place: the mean over ranks (the sum, then scaled by 1/size). Virtual
  // because an engine that takes device memory must scale on the device.
  virtual void allreduce_mean(float* data, size_t n);
  // In place: every rank ends with `root`'s data. The second form waits up
  // to `timeout` instead of options.timeout (e.g. while the leader syncs
  // with the federation, which may take a whole round).
  void broadcast(float* data, size_t n, int root) { broadcast(data, n, root, timeout()); }
  virtual void broadcast(float* data, size_t n, int root, std::chrono::milliseconds timeout) = 0;
  // `bytes` of `root`, bit for bit, on every rank (resized to fit).
  void broadcast_bytes(std::vector<uint8_t>& bytes, int root, std::chrono::milliseconds timeout);
  virtual std::chrono::milliseconds timeout() const = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // True when allreduce_sum/allreduce_mean/broadcast take CUDA device
  // memory (the NCCL engine, fedwan::cuda::make_site_comm); the Gloo engine
  // takes host memory only.
  virtual bool accepts_device_memory() const { return false; }
};

// The Gloo engine (CPU ranks, TCP). Blocks until every rank of the site has
// joined, at most options.timeout; throws TransportError when they do not.
FEDWAN_API std::unique_ptr<SiteComm> make_gloo_comm(const SiteCommOptions& options);

}  // namespace fedwan
