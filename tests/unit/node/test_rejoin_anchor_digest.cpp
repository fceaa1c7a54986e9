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
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/temp_dir.hpp"
#include "harness/wait_for.hpp"
#include "wire/frame.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::wait_for;
using Digest = std::array<uint8_t, 32>;

// root -> site-0, or root -> region-0 -> site-0 (heartbeats every 100 ms,
// a timeout of 1 s).
Topology make_topology(const std::filesystem::path& dir, bool region) {
  testing::IpcTree t;
  t.job = "anchor-digest";
  t.rounds = 3;
  t.region = region;
  return testing::ipc_tree(dir, t);
}

constexpr uint64_t kElements = 1000;

// The root's end of the link: a FakeRoot (heartbeats every 100 ms) that
// welcomes the first hello "no change" at round 0 with the digest the site
// offered, as a root given the same initial model does, and every later
// hello that offers a digest with `rejoin_digest`, lifting `silent` (set by
// the test: the site then reconnects). A child whose session timed out
// before that welcome reached it says hello again with its digest, and is
// answered the same way. Hellos that offer none are only counted: a child
// that asks for the model in full waits for it. Every hello's digest is
// kept.
class ScriptedRoot {
 public:
  ScriptedRoot(const Topology& topo, const Digest& rejoin_digest)
      : rejoin_digest_(rejoin_digest), root_(topo, topo.root().endpoint, /*mute=*/false) {
    root_.on_hello = [this](testing::FakeRoot& r, const std::string& child,
                            const wire::ParsedFrame& f) {
      wire::HelloPayload hello;
      if (!wire::decode_hello(f.payload, f.payload_size, &hello)) return;
      size_t n = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        hellos_.push_back(hello.model_digest);
        n = hellos_.size();
      }
      if (n > 1 && hello.model_digest == Digest{}) return;
      const Digest& digest = n == 1 ? hello.model_digest : rejoin_digest_;
      wire::FrameHeader h = r.header(wire::MsgType::kWelcome);
      h.flags = wire::kFlagNoChange;
      h.total_elements = kElements;
      r.send(child, h, std::vector<uint8_t>(digest.begin(), digest.end()));
      if (n > 1) r.silent = false;
    };
    root_.serving = true;
  }

  std::atomic<bool>& silent() { return root_.silent; }
  std::vector<Digest> hellos() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hellos_;
  }

 private:
  const Digest rejoin_digest_;
  mutable std::mutex mu_;
  std::vector<Digest> hellos_;
  testing::FakeRoot root_;  // last: its thread runs the handler over the members above
};

struct Rejoined {
  std::vector<Digest> hellos;
  std::string audit;
  Digest anchor{};
};

// Whether a hello after the first offered no digest: the child asked for
// the model in full.
bool asked_in_full(const std::vector<Digest>& hellos) {
  for (size_t i = 1; i < hellos.size(); ++i) {
    if (hellos[i] == Digest{}) return true;
  }
  return false;
}

// The hellos before the first that offered no digest (all of them if none
// did).
std::vector<Digest> offering(const std::vector<Digest>& hellos) {
  std::vector<Digest> out;
  for (const Digest& d : hellos) {
    if (d == Digest{}) break;
    out.push_back(d);
  }
  return out;
}

// The site joins, then syncs round 0 while the root is silent: it
// reconnects, and its second hello is welcomed with `rejoin_digest`
// (kAnchor: the digest of the site's own anchor). Returns once the site
// asked for the model in full or `settle` passed after its second hello.
Rejoined rejoin(bool wrong_digest, Clock::duration settle) {
  testing::TempDir dir;
  const Topology topo = make_topology(dir.path(), /*region=*/false);
  std::vector<float> params(kElements);
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
      root.silent() = true;
      for (float& p : params) p += 0.5f;  // trained
      site.sync();
    } catch (const std::exception& e) {
      ended = e.what();
    }
  });
  const bool second = wait_for([&] { return root.hellos().size() >= 2; }, 30s);
  if (second) wait_for([&] { return asked_in_full(root.hellos()); }, settle);
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
  std::vector<float> init(kElements);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.002f * static_cast<float>(i % 89);
  Rejoined out;
  out.anchor = sha256(init.data(), init.size() * sizeof(float));
  Digest rejoin_digest = out.anchor;
  if (wrong_digest) rejoin_digest[3] ^= 0x01;
  ScriptedRoot root(topo, rejoin_digest);
  // The region holds the model already, as after an earlier round.
  testing::NodeSpawner nodes;
  testing::spawn_aggregator(nodes, topo, "region-0", init, nullptr, [&](AggregatorOptions& o) {
    o.initial_model = init;
    o.spill_from_bytes = AggregatorOptions{}.spill_from_bytes;
    o.security.audit_log = (dir.path() / "region-0.jsonl").string();
  });
  std::vector<float> params = init;
  SiteCore site(testing::site_options(topo, "site-0", 60s), params.data(), params.size());
  std::thread runner([&] {
    try {
      site.join();
      root.silent() = true;
      for (float& p : params) p += 0.25f;  // trained
      site.sync();
    } catch (const std::exception&) {
      // stopped
    }
  });
  const bool second = wait_for([&] { return root.hellos().size() >= 2; }, 30s);
  if (second) wait_for([&] { return asked_in_full(root.hellos()); }, settle);
  site.stop();
  runner.join();
  nodes.stop();
  nodes.join();
  const std::string region_ended = nodes.errors();
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
  // Joining (its initial model) and rejoining at round 0 (its anchor), the
  // site offers its anchor's digest: once more if its session timed out
  // before the welcome reached it. Then it asks for the model in full.
  const std::vector<Digest> offered = offering(r.hellos);
  ASSERT_GE(offered.size(), 2u);
  for (const Digest& d : offered) EXPECT_EQ(d, r.anchor);
  EXPECT_TRUE(asked_in_full(r.hellos)) << "the site offered its anchor again";
  EXPECT_NE(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
  EXPECT_NE(r.audit.find(to_hex(r.anchor.data(), r.anchor.size())), std::string::npos);
}

TEST(SiteAnchorDigest, AWelcomeNamingItsOwnAnchorIsTakenAsItIs) {
  // Two heartbeat timeouts after the welcome: a site that doubted it would
  // have said hello again at once.
  const Rejoined r = rejoin(/*wrong_digest=*/false, 2s);
  ASSERT_GE(r.hellos.size(), 2u);
  EXPECT_FALSE(asked_in_full(r.hellos)) << "the site asked for the model it holds";
  EXPECT_EQ(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
}

}  // namespace
}  // namespace fedwan

namespace fedwan {
namespace {

TEST(RegionAnchorDigest, AWelcomeNamingAnotherAnchorGetsAHelloAskingForTheModelInFull) {
  const Rejoined r = rejoin_region(/*wrong_digest=*/true, 30s);
  const std::vector<Digest> offered = offering(r.hellos);
  ASSERT_GE(offered.size(), 2u);
  for (const Digest& d : offered) EXPECT_EQ(d, r.anchor);
  EXPECT_TRUE(asked_in_full(r.hellos)) << "the region offered its anchor again";
  EXPECT_NE(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
}

TEST(RegionAnchorDigest, AWelcomeNamingItsOwnAnchorIsTakenAsItIs) {
  const Rejoined r = rejoin_region(/*wrong_digest=*/false, 2s);
  ASSERT_GE(r.hellos.size(), 2u);
  EXPECT_FALSE(asked_in_full(r.hellos)) << "the region asked for the model it holds";
  EXPECT_EQ(r.audit.find("\"anchor_mismatch\""), std::string::npos) << r.audit;
}

}  // namespace
}  // namespace fedwan
