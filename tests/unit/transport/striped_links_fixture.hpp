// The fixture of the striped-link tests (test_striped_links.cpp,
// test_striped_pieces.cpp): a root and its children over real sockets and
// real TLS sessions (NodeSecurity, as a node sets them up), through the
// fault-injecting transport, and numbered frames to send both ways.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/security.hpp"
#include "fedwan/topology.hpp"
#include "harness/faulty_transport.hpp"
#include "harness/process.hpp"
#include "node/node_security.hpp"
#include "security/certs.hpp"
#include "transport/links.hpp"
#include "wire/frame.hpp"

namespace fedwan::transport::striped {

namespace fs = std::filesystem;
using namespace std::chrono_literals;  // NOLINT: test fixture
using testing::FaultInjector;
using testing::FaultRule;
using Clock = std::chrono::steady_clock;

inline std::string topology_yaml(int port) {
  return "job: unit-striped\n"
         "federation: {streams: 3}\n"
         "nodes:\n"
         "  - {id: root, role: root, endpoint: \"tcp://127.0.0.1:" +
         std::to_string(port) +
         "\"}\n"
         "  - {id: a, role: site, parent: root}\n"
         "  - {id: b, role: site, parent: root, streams: 1}\n"
         "  - {id: c, role: site, parent: root, streams: auto, max_streams: 4}\n";
}

// A frame whose chunk index tells its place in the sequence sent: a delta
// chunk, or (every odd one, with `pieces`) a checkpoint piece.
inline std::vector<uint8_t> numbered(const Topology& topo, uint32_t sender, uint32_t n,
                                     size_t payload = 3000, bool pieces = false) {
  wire::FrameHeader h;
  if (pieces && n % 2 == 1) {
    h.type = wire::MsgType::kCheckpoint;
    h.job_id = topo.job_id();
    h.round = 1;
    h.sender = sender;
    h.chunk_index = n;
    h.chunk_count = 1000;
    h.element_count = static_cast<uint32_t>(payload);
    h.total_elements = 1000 * payload;
    std::vector<uint8_t> body(payload, static_cast<uint8_t>(n));
    return wire::encode_frame(h, body.data(), body.size());
  }
  h.type = wire::MsgType::kDelta;
  h.codec = 1;
  h.job_id = topo.job_id();
  h.round = 1;
  h.sender = sender;
  h.chunk_index = n;
  h.chunk_count = 1u << 20;  // numbers up to a million
  h.element_count = static_cast<uint32_t>(payload / 4);
  h.total_elements = uint64_t{h.chunk_count} * h.element_count;
  h.weight = 1.0;
  std::vector<uint8_t> body(payload, static_cast<uint8_t>(n));
  return wire::encode_frame(h, body.data(), body.size());
}

inline uint32_t number_of(const Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size);
  EXPECT_TRUE(f.ok()) << f.detail;
  return f.header.chunk_index;
}

inline std::vector<uint32_t> sorted(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The pieces (the odd numbers) among `v`, in the order they came.
inline std::vector<uint32_t> pieces_of(const std::vector<uint32_t>& v) {
  std::vector<uint32_t> out;
  for (uint32_t n : v) {
    if (n % 2 == 1) out.push_back(n);
  }
  return out;
}

class StripedLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = testing::free_tcp_port();
    topo_ = std::make_unique<Topology>(Topology::parse(topology_yaml(port_)));
    dir_ = fs::temp_directory_path() / ("fedwan-striped-" + std::to_string(std::random_device{}()));
    security::provision_federation(*topo_, dir_.string());
    faults_ = std::make_shared<FaultInjector>();
    transport_ = std::make_unique<testing::FaultyTransport>(make_transport(endpoint()), faults_);
  }
  void TearDown() override {
    children_.reset();
    parent_link_.reset();
    parent_sec_.reset();
    child_sec_.clear();
    fs::remove_all(dir_);
  }

  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

  SecurityOptions options_for(const std::string& node) {
    SecurityOptions o;
    o.credentials_dir = (dir_ / node).string();
    return o;
  }

  void start_parent(Millis reorder_wait = 5000ms, LinkOptions options = {}) {
    parent_sec_ = std::make_unique<node::NodeSecurity>(options_for("root"), *topo_, topo_->root());
    LinkAdmission a = parent_sec_->children_admission();
    a.reorder_wait = reorder_wait;
    a.on_drop = [this, audit = a.on_drop](const std::string& peer, const std::string& source,
                                          const std::string& why, size_t bytes) {
      drops_.push_back(why);
      audit(peer, source, why, bytes);
    };
    children_ = std::make_unique<ChildrenLink>(*transport_, endpoint(), options,
                                               parent_sec_->children_factory(), a);
  }

  // The parent's process ends and a new one binds its port. ZeroMQ closes
  // the old listening socket on its I/O thread, after the link is gone, so
  // the new one binds once that has happened (a process that restarted
  // finds its old one's socket closed by the kernel).
  void restart_parent() {
    children_.reset();
    parent_sec_.reset();
    const auto end = Clock::now() + 5s;
    for (;;) {
      try {
        start_parent();
        return;
      } catch (const TransportError&) {
        if (Clock::now() >= end) throw;
        std::this_thread::sleep_for(10ms);
      }
    }
  }

  // `o`: the child's other link options (its streams and reordering are
  // set from the arguments).
  std::unique_ptr<ParentLink> connect(const std::string& id, int streams, SecurityOptions so = {},
                                      Millis reorder_wait = 5000ms, bool adaptive = false,
                                      LinkOptions o = {}) {
    if (so.credentials_dir.empty() && !so.insecure_plaintext) so = options_for(id);
    child_sec_.push_back(std::make_unique<node::NodeSecurity>(so, *topo_, topo_->node(id)));
    o.streams = streams;
    o.adaptive_streams = adaptive;
    o.reorder_wait_ms = static_cast<int>(reorder_wait.count());
    return std::make_unique<ParentLink>(*transport_, endpoint(), id, o,
                                        child_sec_.back()->parent_factory());
  }

  // Serves both ends on this thread until `done` or the time runs out.
  bool pump(ParentLink& child, const std::function<bool()>& done, Millis limit = 10000ms) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      Incoming in;
      while (children_->recv(&in, 0ms)) up_.push_back(number_of(in));
      while (child.recv(&in, 0ms)) down_.push_back(number_of(in));
      if (done()) return true;
      std::this_thread::sleep_for(1ms);
    }
    return done();
  }

  // Sends `n` numbered frames each way, at most one per direction and
  // millisecond, and waits for them.
  void exchange(ParentLink& child, const std::string& id, uint32_t n, bool pieces = false,
                size_t payload = 3000) {
    const uint32_t sender = topo_->node(id).index;
    uint32_t sent_up = 0, sent_down = 0;
    ASSERT_TRUE(pump(child,
                     [&] {
                       if (sent_up < n &&
                           child.try_send(numbered(*topo_, sender, sent_up, payload, pieces))) {
                         ++sent_up;
                       }
                       if (sent_down < n && children_->established(id) &&
                           children_->try_send(id, numbered(*topo_, topo_->root().index, sent_down,
                                                            payload, pieces))) {
                         ++sent_down;
                       }
                       return up_.size() >= n && down_.size() >= n;
                     }))
        << "up " << up_.size() << " down " << down_.size();
  }

  static std::vector<uint32_t> iota(uint32_t n) {
    std::vector<uint32_t> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = i;
    return v;
  }

  int port_ = 0;
  fs::path dir_;
  std::unique_ptr<Topology> topo_;
  std::shared_ptr<FaultInjector> faults_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<node::NodeSecurity> parent_sec_;
  std::vector<std::unique_ptr<node::NodeSecurity>> child_sec_;
  std::unique_ptr<ChildrenLink> children_;
  std::unique_ptr<ParentLink> parent_link_;
  std::vector<uint32_t> up_, down_;
  std::vector<std::string> drops_;  // the parent's reasons
};

}  // namespace fedwan::transport::striped
