// Hostile and broken peers: an aggregator refuses them with a clear reason,
// counts nothing they sent, and keeps serving the honest sites to a result
// equal to the reference.
#include <gtest/gtest.h>

#include <cstring>

#include <zmq.hpp>

#include "common/sha256.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/raw_site.hpp"
#include "harness/reference_federation.hpp"
#include "node/node_frames.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 11;
constexpr size_t kParams = 3000;

TEST(BadInput, AggregatorRefusesBrokenPeersAndKeepsServing) {
  TempDir dir;
  FederationSpec fed;
  fed.rounds = 3;
  fed.inner_steps = 2;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;  // 1024 elements a chunk: 3 chunks
  fed.round_timeout_s = 20;
  const Topology topo = make_tree(dir.path(), 1, 2, fed);  // root - region-0 - site-0, site-1
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const uint32_t rogue_index = topo.node("site-1").index;

  AggregatorSummary root_summary, region_summary;
  std::vector<float> honest_final = init;
  NodeSpawner nodes;
  nodes.spawn("root", [&](NodeStopper& stopper) {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "root";
    o.initial_model = init;
    o.join_timeout = std::chrono::seconds(20);
    o.security = security_for(topo, "root");
    Aggregator root(std::move(o));
    const auto bound = stopper.bind([&root] { root.stop(); });
    root_summary = root.run();
  });
  nodes.spawn("region-0", [&](NodeStopper& stopper) {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "region-0";
    o.join_timeout = std::chrono::seconds(20);
    o.security = security_for(topo, "region-0");
    Aggregator region(std::move(o));
    const auto bound = stopper.bind([&region] { region.stop(); });
    region_summary = region.run();
  });
  nodes.spawn("site-0", [&](NodeStopper& stopper) {
    SiteOptions o;
    o.topology = topo;
    o.node_id = "site-0";
    o.join_timeout = std::chrono::seconds(20);
    o.security = security_for(topo, "site-0");
    o.round_timeout = std::chrono::seconds(20);
    SiteCore site(std::move(o), honest_final.data(), honest_final.size());
    const auto bound = stopper.bind([&site] { site.stop(); });
    SyncResult r = site.join();
    while (!r.finished) {
      synthetic::local_steps(honest_final.data(), kParams, topo.node("site-0").index, 2, kSeed);
      r = site.sync();
    }
  });

  zmq::context_t ctx;
  std::vector<uint8_t> buf;

  // A peer under an id that is no node of the federation (and speaks
  // plaintext) is refused before any state is kept for it, and told why.
  {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, "intruder");
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 10000);
    s.connect(topo.node("region-0").endpoint);
    wire::FrameHeader h = node::node_header(topo, 99, wire::MsgType::kHello, 0);
    s.send(zmq::buffer(node::make_frame(h, {})), zmq::send_flags::none);
    zmq::message_t reply;
    ASSERT_TRUE(s.recv(reply).has_value());
    const auto f = wire::parse_frame(static_cast<uint8_t*>(reply.data()), reply.size());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f.header.type, wire::MsgType::kReject);
    const std::string why(reinterpret_cast<const char*>(f.payload), f.payload_size);
    EXPECT_NE(why.find("'intruder' is not a node of topology"), std::string::npos) << why;
  }

  // The rogue site joins properly...
  RawSite rogue(topo, "site-1",
                test_client_security(topo, "site-1", security_for(topo, "site-1").credentials_dir));
  rogue.hello(init);
  wire::ParsedFrame f = rogue.recv(&buf);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f.header.type, wire::MsgType::kWelcome);

  // ...then sends a frame of an unknown protocol version: dropped, no reply.
  std::vector<uint8_t> bad = rogue.delta(0, 0, 3, 1024, 1024, kParams);
  bad[4] = 99;
  rogue.send(bad);  // sealed: it authenticates, then fails parsing
  // ...and a delta whose element count disagrees with the chunk plan.
  rogue.send(rogue.delta(0, 2, 3, 952, 1000, kParams));
  f = rogue.recv(&buf);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f.header.type, wire::MsgType::kReject);
  const std::string why(reinterpret_cast<const char*>(f.payload), f.payload_size);
  EXPECT_NE(why.find("1000"), std::string::npos) << why;
  EXPECT_NE(why.find("952"), std::string::npos) << why;

  // Then it behaves: a zero delta each round, reading the anchors.
  for (uint64_t round = 0; round < fed.rounds; ++round) {
    for (uint32_t c = 0; c < 3; ++c) {
      const uint32_t n = c < 2 ? 1024 : 952;
      rogue.send(rogue.delta(round, c, 3, n, n, kParams));
    }
    for (int got = 0; got < 3;) {
      f = rogue.recv(&buf);
      ASSERT_TRUE(f.ok());
      if (f.header.type == wire::MsgType::kAnchor) ++got;
    }
  }
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");

  // Nothing the rogue sent while broken was counted: the result equals a
  // federation where site-1 simply never moved.
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    if (site != rogue_index) synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  ASSERT_EQ(root_summary.global_model.size(), ref.global.size());
  EXPECT_EQ(0, std::memcmp(root_summary.global_model.data(), ref.global.data(),
                           ref.global.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(honest_final.data(), ref.held.data(), ref.held.size() * sizeof(float)));
  // Plaintext intruder, unknown version, wrong element count.
  EXPECT_GE(region_summary.rejected_frames, 3u);
}

}  // namespace
}  // namespace fedwan::testing
