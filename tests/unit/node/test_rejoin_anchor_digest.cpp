// A site or region that rejoins its parent at its round offers the digest of
// the anchor it holds, and a parent that takes its word answers "no change"
// with its own anchor's digest. Where the two differ the child must not
// train on: it says hello again offering no digest (so the parent sends the
// model in full) and audits the mismatch. A scripted root plays the parent.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/sha256.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "node/node_config.hpp"
#include "node/node_frames.hpp"
#include "node/node_security.hpp"
#include "transport/links.hpp"
#include "transport/transport.hpp"
#include "wire/frame.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Digest = std::array<uint8_t, 32>;

template <typename Done>
bool wait_for(Done done, Clock::duration limit) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// root -> site-0, or root -> region-0 -> site-0, over ipc:// sockets in
// `dir`, heartbeats every 100 ms and a timeout of 1 s.
Topology make_topology(const std::filesystem::path& dir, bool region) {
  FederationSpec f;
  f.rounds = 3;
  f.heartbeat_s = 0.1;
  f.heartbeat_timeout_s = 1;
  NodeSpec root;
  root.id = "root";
  root.role = Role::kRoot;
  root.endpoint = "ipc://" + (dir / "root.sock").string();
  std::vector<NodeSpec> nodes = {root};
  if (region) {
    NodeSpec r;
    r.id = "region-0";
    r.role = Role::kRegion;
    r.parent = "root";
    r.endpoint = "ipc://" + (dir / "region.sock").string();
    nodes.push_back(r);
  }
  NodeSpec site;
  site.id = "site-0";
  site.role = Role::kSite;
  site.parent = region ? "region-0" : "root";
  nodes.push_back(site);
  return Topology::build("anchor-digest", f, nodes);
}

// The root's end of the link. It welcomes the first hello "no change" at
// round 0 with the digest the site offered, as a root given the same
// initial model does, and heartbeats the site every 100 ms. While `silent`
// it sends nothing (the site then reconnects); the next hello is welcomed
// "no change" at round 0 with `rejoin_digest`, and the heartbeats resume.
// Every hello's digest is kept.
class ScriptedRoot {
 public:
  ScriptedRoot(const Topology& topo, const Digest& rejoin_digest)
      : topo_(topo),
        config_(topo, topo.root(), node::NodeOverrides{}),
        security_(testing::security_for(topo, topo.root().id), topo, topo.root()),
        transport_(transport::make_transport(topo.root().endpoint)),
        link_(*transport_, topo.root().endpoint, config_.link, security_.children_factory(),
              security_.children_admission()),
        rejoin_digest_(rejoin_digest),
        thread_([this] { loop(); }) {}
  ~ScriptedRoot() {
    stop_ = true;
    thread_.join();
  }
  ScriptedRoot(const ScriptedRoot&) = delete;
  ScriptedRoot& operator=(const ScriptedRoot&) = delete;

  std::atomic<bool> silent{false};
  std::vector<Digest> hellos() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hellos_;
  }

 private:
  void loop() {
    auto next_beat = Clock::now();
    while (!stop_) {
      transport::Incoming in;
      if (link_.recv(&in, 20ms)) on_frame(in);
      if (!silent && !child_.empty() && Clock::now() >= next_beat) {
        next_beat = Clock::now() + 100ms;
        send(wire::MsgType::kHeartbeat, 0, {});
      }
    }
  }

  void on_frame(const transport::Incoming& in) {
    const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size);
    if (!f.ok() || f.header.type != wire::MsgType::kHello) return;
    wire::HelloPayload hello;
    if (!wire::decode_hello(f.payload, f.payload_size, &hello)) return;
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hellos_.push_back(hello.model_digest);
      n = hellos_.size();
    }
    child_ = in.peer;
    if (n == 1) {
      welcome(hello.model_digest);
    } else if (n == 2) {
      welcome(rejoin_digest_);
      silent = false;
    }
    // Later hellos are only counted: a site that asks for the model in full
    // waits for it.
  }

  void welcome(const Digest& digest) {
    send(wire::MsgType::kWelcome, wire::kFlagNoChange,
         std::vector<uint8_t>(digest.begin(), digest.end()));
  }

  void send(wire::MsgType type, uint8_t flags, const std::vector<uint8_t>& payload) {
    wire::FrameHeader h = node::node_header(topo_, topo_.root().index, type, 0);
    h.flags = flags;
    if (type == wire::MsgType::kWelcome) h.total_elements = kElements;
    try {
      (void)link_.try_send(child_, node::make_frame(h, payload));
    } catch (const Error&) {
      // Between sessions: the site says hello again on its next one.
    }
  }

 public:
  static constexpr uint64_t kElements = 1000;

 private:
  const Topology& topo_;
  node::NodeConfig config_;
  node::NodeSecurity security_;
  std::unique_ptr<transport::Transport> transport_;
  transport::ChildrenLink link_;
  const Digest rejoin_digest_;
  std::string child_;  // the loop thread's
  mutable std::mutex mu_;
  std::vector<Digest> hellos_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it runs over the members above
};

struct Rejoined {
  std::vector<Digest> hellos;
  std::string audit;
  Digest anchor{};
};

// The site joins, then syncs round 0 while the root is silent: it
// reconnects, and its second hello is welcomed with `rejoin_digest`
// (kAnchor: the digest of the site's own anchor). Returns once the site
// said hello three times or `settle` passed after the second.
Rejoined rejoin(bool wrong_digest, Clock::duration settle) {
  testing::TempDir dir;
  const Topology topo = make_topology(dir.path(), /*region=*/false);
  std::vector<float> params(ScriptedRoot::kElements);
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.001f * static_cast<float>(i % 97);
  Rejoined out;
  out.anchor = sha256(params.data(), params.size() * sizeof(float));
  Digest rejoin_digest = out.anchor;
  if (wrong_digest) rejoin_digest[7] ^= 0x10;
  ScriptedRoot root(topo, rejoin_digest);
  SiteOptions o = testing::site_options(topo, "site-0", 60s);
  o.security.audit_log = (dir.path() / "site-0.jsonl").string();
  SiteCore site(std::move(o), params.data(), params.size());
  std::string ended;
  std::thread runner([&] {
    try {
      site.join();
      root.silent = true;
      for (float& p : params) p += 0.5f;  // trained
      site.sync();
    } catch (const std::exception& e) {
      ended = e.what();
    }
  });
  const bool second = wait_for([&] { return root.hellos().size() >= 2; }, 30s);
  if (second) wait_for([&] { return root.hellos().size() >= 3; }, settle);
  site.stop();
  runner.join();
  EXPECT_TRUE(second) << "the site did not reconnect to its silent parent";
  EXPECT_NE(ended.find("stopped"), std::string::npos) << ended;
  out.hellos = root.hellos();
  std::ifstream audit(dir.path() / "site-0.jsonl");
  out.audit.assign(std::istreambuf_iterator<char>(audit), std::istreambuf_iterator<char>());
  return out;
}

// The same for a region (given the initial model, so its first hello
// offers its digest): its site trains and syncs round 0, the region sends
// its aggregate up to the silent root, reconnects, and is welcomed back.
Rejoined rejoin_region(bool wrong_digest, Clock::duration settle) {
  testing::TempDir dir;
  const Topology topo = make_topology(dir.path(), /*region=*/true);
  std::vector<float> init(ScriptedRoot::kElements);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.002f * static_cast<float>(i % 89);
  Rejoined out;
  out.anchor = sha256(init.data(), init.size() * sizeof(float));
  Digest rejoin_digest = out.anchor;
  if (wrong_digest) rejoin_digest[3] ^= 0x01;
  ScriptedRoot root(topo, rejoin_digest);
  AggregatorOptions ao;
  ao.topology = topo;
  ao.node_id = "region-0";
  ao.join_timeout = 60s;
  ao.security = testing::security_for(topo, "region-0");
  ao.security.audit_log = (dir.path() / "region-0.jsonl").string();
  ao.initial_model = init;
  Aggregator region(std::move(ao));
  std::string region_ended;
  std::thread region_thread([&] {
    try {
      region.run();
    } catch (const std::exception& e) {
      region_ended = e.what();
    }
  });
  std::vector<float> params = init;
  SiteCore site(testing::site_options(topo, "site-0", 60s), params.data(), params.size());
  std::thread runner([&] {
    try {
      site.join();
      root.silent = true;
      for (float& p : params) p += 0.25f;  // trained
      site.sync();
    } catch (const std::exception&) {
      // stopped
    }
  });
  const bool second = wait_for([&] { return root.hellos().size() >= 2; }, 30s);
  if (second) wait_for([&] { return root.hellos().size() >= 3; }, settle);
  site.stop();
  runner.join();
  region.stop();
  region_thread.join();
  EXPECT_TRUE(second) << "the region did not reconnect to its silent parent";
  EXPECT_TRUE(region_ended.empty() || region_ended.find("stopped") != std::string::npos)
      << region_ended;
  out.hellos = root.hellos();
  std::ifstream audit(dir.path() / "region-0.jsonl");
  out.audit.assign(std::istreambuf_iterator<char>(audit), std::istreambuf_iterator<char>());
  return out;
}

TEST(SiteAnchorDigest, AWelcomeNamingAnotherAnchorGetsAHelloAskingForTheModelInFull) {
  const Rejoined r = rejoin(/*wrong_digest=*/true, 30s);
  ASSERT_GE(r.hellos.size(), 3u);
  EXPECT_EQ(r.hellos[0], r.anchor);  // joining: its initial model
  EXPECT_EQ(r.hellos[1], r.anchor);  // rejoining at round 0: its anchor
  EXPECT_EQ(r.hellos[2], Digest{}) << "the site offered its anchor again";
  EXPECT_NE(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
  EXPECT_NE(r.audit.find(to_hex(r.anchor.data(), r.anchor.size())), std::string::npos);
}

TEST(SiteAnchorDigest, AWelcomeNamingItsOwnAnchorIsTakenAsItIs) {
  // Two heartbeat timeouts after the welcome: a site that doubted it would
  // have said hello again at once.
  const Rejoined r = rejoin(/*wrong_digest=*/false, 2s);
  EXPECT_EQ(r.hellos.size(), 2u);
  EXPECT_EQ(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
}

}  // namespace
}  // namespace fedwan

namespace fedwan {
namespace {

TEST(RegionAnchorDigest, AWelcomeNamingAnotherAnchorGetsAHelloAskingForTheModelInFull) {
  const Rejoined r = rejoin_region(/*wrong_digest=*/true, 30s);
  ASSERT_GE(r.hellos.size(), 3u);
  EXPECT_EQ(r.hellos[0], r.anchor);  // joining: the initial model
  EXPECT_EQ(r.hellos[1], r.anchor);  // rejoining at round 0: its anchor
  EXPECT_EQ(r.hellos[2], Digest{}) << "the region offered its anchor again";
  EXPECT_NE(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
}

TEST(RegionAnchorDigest, AWelcomeNamingItsOwnAnchorIsTakenAsItIs) {
  const Rejoined r = rejoin_region(/*wrong_digest=*/false, 2s);
  EXPECT_EQ(r.hellos.size(), 2u);
  EXPECT_EQ(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
}

}  // namespace
}  // namespace fedwan
