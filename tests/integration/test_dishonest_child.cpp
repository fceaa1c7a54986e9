// An authenticated but dishonest child: it holds valid credentials for its
// own node and speaks the protocol, but lies in every header and telemetry
// field the parent already knows. Nothing it claims may change the result:
// the parent takes those values from the topology, or refuses them.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint_file.hpp"
#include "fedwan/error.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_threads.hpp"
#include "harness/raw_site.hpp"
#include "harness/reference_federation.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 41;
constexpr size_t kParams = 3000;  // 3 chunks of 1024, 1024, 952

uint32_t chunk_n(uint32_t c) { return c < 2 ? 1024 : 952; }

// Finding: a site chose its own weight. Here site-1 sends every round's
// delta under another weight: 1e300 (the region overflowed and died), 1e6
// (its update outweighed everyone's) and 1e-3. The federation must finish
// with the model of the federation in which it sent its topology weight.
TEST(DishonestChild, HeaderWeightOfASiteChangesNothing) {
  TempDir dir;
  FederationSpec fed = small_fp32_federation(3);
  fed.quorum = 0.9;
  const Topology topo = make_tree(dir.path(), 1, 2, fed);  // root - region-0 - site-0, site-1
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path region_audit = dir.path() / "region-0.audit";
  AggregatorSummary root_summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &root_summary);
  spawn_aggregator(nodes, topo, "region-0", init, nullptr,
                   [&](AggregatorOptions& o) { o.security.audit_log = region_audit.string(); });
  spawn_synthetic_site(nodes, topo, "site-0", init, kSeed, 2);

  RawSite rogue(topo, "site-1",
                test_client_security(topo, "site-1", security_for(topo, "site-1").credentials_dir));
  std::vector<uint8_t> buf;
  rogue.hello(init);
  wire::ParsedFrame f = rogue.recv(&buf);
  ASSERT_TRUE(f.ok()) << f.detail;
  ASSERT_EQ(f.header.type, wire::MsgType::kWelcome);
  const double lies[] = {1e300, 1e6, 1e-3};
  for (uint64_t round = 0; round < 3; ++round) {
    for (uint32_t c = 0; c < 3; ++c) {
      rogue.send(rogue.delta(round, c, 3, chunk_n(c), chunk_n(c), kParams, 0.0f, lies[round]));
    }
    for (int got = 0; got < 3;) {
      f = rogue.recv(&buf);
      ASSERT_TRUE(f.ok()) << "round " << round << ": " << f.detail;
      if (f.header.type == wire::MsgType::kAnchor) ++got;
    }
  }
  do {
    f = rogue.recv(&buf);
    ASSERT_TRUE(f.ok()) << f.detail;
  } while (f.header.type != wire::MsgType::kDone);
  rogue.send(
      node::make_frame(node::node_header(topo, rogue.node().index, wire::MsgType::kDone, 3), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");

  const uint32_t rogue_index = rogue.node().index;
  // site-1 sent zero deltas: under its true weight they pull the mean
  // towards the anchor by its share of the weight, no more.
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    if (site != rogue_index) synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  ASSERT_EQ(root_summary.global_model.size(), ref.global.size());
  EXPECT_EQ(0, std::memcmp(root_summary.global_model.data(), ref.global.data(),
                           ref.global.size() * sizeof(float)));
  const double total = topo.weight_under(topo.root().index);
  for (const RoundReport& r : root_summary.reports) EXPECT_EQ(r.weight, total) << r.round;
  // Each lie is on the record next to the weight that was used.
  EXPECT_EQ(count_audit(region_audit, "update", "\"claimed_weight\""), 9u);
}

std::vector<uint8_t> telemetry(const RawSite& s, const Topology& topo, uint64_t round, uint64_t wan,
                               uint64_t frames) {
  wire::TelemetryPayload t{wan, wan, frames};
  return node::make_frame(node::node_header(topo, s.node().index, wire::MsgType::kTelemetry, round),
                          wire::encode_telemetry(t));
}

// A region is an aggregator its sites trust with their deltas, but the root
// still bounds what it may claim: no more weight than its sites have, the
// federation's codec, one traffic report per round, plausible counts, and
// checkpoints only of rounds it went through.
TEST(DishonestChild, RegionClaimsAreBoundedByTheTopology) {
  TempDir dir;
  const Topology topo = make_tree(dir.path(), 1, 2, small_fp32_federation(2));
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  const fs::path root_audit = dir.path() / "root.audit";
  const fs::path root_ckpt = dir.path() / "root-ckpt";
  AggregatorSummary root_summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &root_summary, [&](AggregatorOptions& o) {
    o.security.audit_log = root_audit.string();
    o.checkpoint_dir = root_ckpt.string();
    o.replica_max_bytes = 1 << 20;
  });
  RawSite rogue(
      topo, "region-0",
      test_client_security(topo, "region-0", security_for(topo, "region-0").credentials_dir));
  const double subtree = topo.weight_under(topo.node("region-0").index);
  std::vector<uint8_t> buf;
  rogue.hello(init);
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kWelcome).ok());

  // A checkpoint of a round far ahead of the root's.
  Checkpoint future;
  future.round = 1000;
  future.topology_digest = topo.digest();
  future.node_id = "region-0";
  future.sections.push_back({"meta", {'{', '}'}});
  const fs::path future_file = dir.path() / "future.fwck";
  write_checkpoint(future_file, future);
  std::ifstream in(future_file, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  wire::FrameHeader ck =
      node::node_header(topo, rogue.node().index, wire::MsgType::kCheckpoint, 1000);
  ck.chunk_count = 1;
  ck.element_count = static_cast<uint32_t>(bytes.size());
  ck.total_elements = bytes.size();
  rogue.send(node::make_frame(ck, bytes));
  // A replica announcing more than the root keeps for one (its
  // replica_max_bytes, set below): refused at its first piece, nothing of it
  // written to the root's disk.
  wire::FrameHeader huge =
      node::node_header(topo, rogue.node().index, wire::MsgType::kCheckpoint, 0);
  huge.chunk_count = 512;
  huge.element_count = 4096;
  huge.total_elements = 512 * 4096;
  rogue.send(node::make_frame(huge, std::vector<uint8_t>(4096, 0x5a)));

  const auto fp16_delta = [&](uint32_t c) {
    const Codec& fp16 = codec_by_name("fp16");
    std::vector<float> zeros(chunk_n(c), 0.0f);
    std::vector<uint8_t> payload(fp16.encoded_size(chunk_n(c)));
    std::vector<float> residual(chunk_n(c), 0.0f);
    fp16.encode(zeros.data(), chunk_n(c), residual.data(), payload.data());
    wire::FrameHeader h = node::node_header(topo, rogue.node().index, wire::MsgType::kDelta, 0);
    h.codec = static_cast<uint8_t>(fp16.id());
    h.chunk_index = c;
    h.chunk_count = 3;
    h.element_count = chunk_n(c);
    h.total_elements = kParams;
    h.weight = subtree;
    return node::make_frame(h, payload);
  };
  for (uint64_t round = 0; round < 2; ++round) {
    if (round == 0) {
      rogue.send(rogue.delta(0, 0, 3, 1024, 1024, kParams, 0.0f, 2 * subtree));  // too heavy
      rogue.send(fp16_delta(1));                                                 // another codec
    }
    for (uint32_t c = 0; c < 3; ++c) {
      rogue.send(rogue.delta(round, c, 3, chunk_n(c), chunk_n(c), kParams, 0.0f, subtree));
    }
    for (int got = 0; got < 3;) {
      const wire::ParsedFrame f = await_type(rogue, &buf, wire::MsgType::kAnchor);
      ASSERT_TRUE(f.ok()) << "round " << round << ": " << f.detail;
      ++got;
    }
    if (round == 0) {
      rogue.send(telemetry(rogue, topo, 0, 1000000, 64));
      rogue.send(telemetry(rogue, topo, 0, 1000000, 64));  // the same round again
      rogue.send(telemetry(rogue, topo, 1, 5000, 1000));   // 1000 frames in 5000 bytes
    } else {
      rogue.send(telemetry(rogue, topo, round, 1000, 2));
    }
  }
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kDone).ok());
  rogue.send(
      node::make_frame(node::node_header(topo, rogue.node().index, wire::MsgType::kDone, 2), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");

  // Zero deltas under FedAvg: the model never moved, and only true weights
  // were aggregated.
  ASSERT_EQ(root_summary.global_model, init);
  ASSERT_EQ(root_summary.reports.size(), 2u);
  for (const RoundReport& r : root_summary.reports) EXPECT_EQ(r.weight, subtree) << r.round;
  EXPECT_GE(root_summary.reports[0].wan_bytes, 1000000u);
  EXPECT_LT(root_summary.reports[0].wan_bytes, 2000000u);  // the report counted once
  EXPECT_LT(root_summary.reports[1].wan_bytes, 1000000u);  // the implausible one not at all
  EXPECT_EQ(count_audit(root_audit, "update", "\"bad_weight\""), 1u);
  EXPECT_EQ(count_audit(root_audit, "update", "\"bad_codec\""), 1u);
  EXPECT_EQ(count_audit(root_audit, "refusal", "1000 frames in 5000 bytes"), 1u);
  EXPECT_EQ(count_audit(root_audit, "replica_refused", "round 1000"), 1u);
  EXPECT_FALSE(fs::exists(root_ckpt / "replicas" / "region-0" / "round-1000.fwck"));
  EXPECT_EQ(count_audit(root_audit, "replica_refused", "announces 2097152 bytes"), 1u);
  const fs::path kept = root_ckpt / "replicas" / "region-0";
  EXPECT_TRUE(!fs::exists(kept) || fs::is_empty(kept));
}

// The first child to say hello used to set a region's model size, and every
// honest child after it was refused. Now the children's weight decides, and
// only the odd one out is refused.
TEST(DishonestChild, FirstHelloDoesNotSetTheModelSize) {
  TempDir dir;
  FederationSpec fed = small_fp32_federation(2);
  fed.heartbeat_s = 0.1;
  fed.heartbeat_timeout_s = 5;
  const Topology topo = make_tree(dir.path(), 1, 2, fed);  // site-0 weighs 100, site-1 137
  const std::vector<float> init = synthetic::initial_model(kParams, kSeed);
  AggregatorSummary root_summary;
  NodeSpawner nodes;
  spawn_aggregator(nodes, topo, "root", init, &root_summary);
  spawn_aggregator(nodes, topo, "region-0", init);
  RawSite rogue(topo, "site-0",
                test_client_security(topo, "site-0", security_for(topo, "site-0").credentials_dir));
  std::vector<uint8_t> buf;
  std::vector<float> bigger = init;
  bigger.push_back(0.0f);
  rogue.hello(bigger);
  // The region heartbeats a child once it has taken its hello.
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kHeartbeat).ok());
  spawn_synthetic_site(nodes, topo, "site-1", init, kSeed, 2);
  const wire::ParsedFrame refused = await_type(rogue, &buf, wire::MsgType::kReject);
  ASSERT_TRUE(refused.ok()) << refused.detail;
  EXPECT_NE(std::string(reinterpret_cast<const char*>(refused.payload), refused.payload_size)
                .find("train 3000"),
            std::string::npos);
  rogue.hello(init);  // comes back with the federation's model
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kWelcome).ok());
  for (uint64_t round = 0; round < 2; ++round) {
    for (uint32_t c = 0; c < 3; ++c) {
      rogue.send(rogue.delta(round, c, 3, chunk_n(c), chunk_n(c), kParams));
    }
    for (int got = 0; got < 3; ++got) {
      ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kAnchor).ok()) << round;
    }
  }
  ASSERT_TRUE(await_type(rogue, &buf, wire::MsgType::kDone).ok());
  rogue.send(
      node::make_frame(node::node_header(topo, rogue.node().index, wire::MsgType::kDone, 2), {}));
  nodes.join();
  ASSERT_EQ(nodes.errors(), "");
  const uint32_t rogue_index = rogue.node().index;
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    if (site != rogue_index) synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  EXPECT_EQ(root_summary.global_model, ref.global);
}

}  // namespace
}  // namespace fedwan::testing
