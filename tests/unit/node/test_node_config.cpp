#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/topology.hpp"
#include "node/node_config.hpp"
#include "node/node_frames.hpp"
#include "wire/frame.hpp"

namespace fedwan::node {
namespace {

using std::chrono::milliseconds;

// A federation with every setting NodeConfig derives from, and `deadline`.
std::string topology_yaml(const std::string& deadline = "  deadline_s: 30\n") {
  return "job: config-test\n"
         "federation:\n"
         "  codec: int8\n"
         "  chunk_bytes: 8192\n"
         "  round_timeout_s: 90\n"
         "  quorum: 0.5\n" +
         deadline +
         "  heartbeat_s: 1.5\n"
         "  heartbeat_timeout_s: 7.25\n"
         "  replica_every: 3\n"
         "nodes:\n"
         "  - {id: root, role: root, endpoint: \"tcp://127.0.0.1:7000\"}\n"
         "  - {id: eu, role: region, parent: root, endpoint: \"tcp://127.0.0.1:7001\"}\n"
         "  - {id: a, role: site, parent: eu, weight: 2}\n"
         "  - {id: b, role: site, parent: eu}\n";
}
const std::string kTopology = topology_yaml();

TEST(NodeConfig, DerivesTheFederationSettingsOnce) {
  const Topology topo = Topology::parse(kTopology);
  const NodeConfig cfg(topo, topo.node("a"), {});
  EXPECT_EQ(cfg.codec->id(), CodecId::kInt8);
  EXPECT_EQ(cfg.chunk_bytes, 8192u);
  EXPECT_EQ(cfg.piece_bytes(), 8192u);
  // Its own pieces are a chunk's int8 frame (2048 values and their scales,
  // under 4 KiB), raised to 4 KiB.
  EXPECT_LT(cfg.codec->encoded_size(2048), 4096u);
  EXPECT_EQ(cfg.upload_piece_bytes(), 4096u);
  EXPECT_EQ(cfg.replica_every, 3u);
  EXPECT_DOUBLE_EQ(cfg.quorum, 0.5);
  EXPECT_EQ(cfg.round_timeout, milliseconds(90000));
  EXPECT_EQ(cfg.heartbeat, milliseconds(1500));
  EXPECT_EQ(cfg.heartbeat_timeout, milliseconds(7250));
  EXPECT_EQ(cfg.finish_wait, milliseconds(30000));  // capped below the round timeout
  EXPECT_EQ(cfg.limits.max_chunk_elements, 2048u);
  EXPECT_EQ(cfg.limits.max_piece_bytes, 8192u);
  EXPECT_EQ(cfg.plan(5000).count(), 3u);
}

TEST(NodeConfig, OptionsOverrideTheTopology) {
  const Topology topo = Topology::parse(kTopology);
  const NodeConfig cfg(topo, topo.node("root"), {3, milliseconds(2500)});
  EXPECT_EQ(cfg.link.window, 3);
  EXPECT_EQ(cfg.round_timeout, milliseconds(2500));
  EXPECT_EQ(cfg.finish_wait, milliseconds(2500));
}

TEST(NodeConfig, ARegionClosesItsRoundsBeforeTheRoot) {
  const Topology topo = Topology::parse(kTopology);
  EXPECT_EQ(NodeConfig(topo, topo.root(), {}).round_deadline, milliseconds(30000));
  EXPECT_EQ(NodeConfig(topo, topo.node("eu"), {}).round_deadline, milliseconds(24000));

  const Topology no_deadline = Topology::parse(topology_yaml(""));
  EXPECT_FALSE(NodeConfig(no_deadline, no_deadline.root(), {}).round_deadline);
}

TEST(NodeConfig, ALinkTakesTheLargestFrameSealed) {
  const Topology topo = Topology::parse(kTopology);
  const NodeConfig cfg(topo, topo.node("b"), {});
  EXPECT_EQ(cfg.link.max_message_bytes, max_message_bytes(8192));
  // A full fp32 anchor chunk, the largest payload, fits with its seal.
  EXPECT_GE(cfg.link.max_message_bytes, int64_t(wire::kHeaderSize + 8192 + 28));
  // So does the largest control frame at the smallest chunk size.
  EXPECT_GE(max_message_bytes(4096),
            int64_t(wire::kHeaderSize + wire::FrameLimits{}.max_control_payload + 28));
}

TEST(NodeConfig, LinksTakeTheNodesTcpCongestionElseTheFederations) {
  const Topology bbr = Topology::parse(kTopology);  // no key: the default, bbr
  EXPECT_EQ(NodeConfig(bbr, bbr.node("a"), {}).link.tcp_congestion, "bbr");
  EXPECT_EQ(NodeConfig(bbr, bbr.root(), {}).link.tcp_congestion, "bbr");

  std::string text = kTopology;
  const std::string site_b = "  - {id: b, role: site, parent: eu}\n";
  text.replace(text.find(site_b), site_b.size(),
               "  - {id: b, role: site, parent: eu, tcp_congestion: reno}\n");
  text.replace(text.find("federation:\n"), 12, "federation:\n  tcp_congestion: system\n");
  const Topology mixed = Topology::parse(text);
  // "system" leaves the host's default alone: nothing is set.
  EXPECT_EQ(NodeConfig(mixed, mixed.node("a"), {}).link.tcp_congestion, "");
  EXPECT_EQ(NodeConfig(mixed, mixed.node("eu"), {}).link.tcp_congestion, "");
  EXPECT_EQ(NodeConfig(mixed, mixed.node("b"), {}).link.tcp_congestion, "reno");
}

TEST(NodeConfig, ModelLimitsBoundTotalsAndCheckpoints) {
  const Topology topo = Topology::parse(kTopology);
  const NodeConfig cfg(topo, topo.node("a"), {});
  const wire::FrameLimits l = cfg.limits_for_model(1000);
  EXPECT_EQ(l.max_total_elements, 1000u);
  EXPECT_EQ(l.max_chunk_elements, cfg.limits.max_chunk_elements);
  EXPECT_EQ(l.max_checkpoint_bytes, (uint64_t{64} << 20) + 1000 * 4 * 16);
}

TEST(ChunkHeader, DescribesTheChunkAFrameCarries) {
  const Topology topo = Topology::parse(kTopology);
  const tensor::ChunkPlan plan = tensor::ChunkPlan::from_bytes(5000, 8192);
  const wire::FrameHeader h =
      chunk_header(topo, 2, wire::MsgType::kDelta, 7, plan, 2, CodecId::kInt8, 2.0);
  EXPECT_EQ(h.type, wire::MsgType::kDelta);
  EXPECT_EQ(h.job_id, topo.job_id());
  EXPECT_EQ(h.sender, 2u);
  EXPECT_EQ(h.round, 7u);
  EXPECT_EQ(h.codec, static_cast<uint8_t>(CodecId::kInt8));
  EXPECT_EQ(h.chunk_index, 2u);
  EXPECT_EQ(h.chunk_count, 3u);
  EXPECT_EQ(h.element_count, 5000u - 2 * 2048u);
  EXPECT_EQ(h.total_elements, 5000u);
  EXPECT_EQ(h.weight, 2.0);
  EXPECT_EQ(h.flags, 0);

  // It parses as what it says, once its payload is there.
  const Codec& codec = *codec_by_id(CodecId::kInt8);
  std::vector<float> values(h.element_count, 0.25f);
  std::vector<uint8_t> payload(codec.encoded_size(values.size()));
  codec.encode(values.data(), values.size(), nullptr, payload.data());
  const std::vector<uint8_t> frame = make_frame(h, payload);
  const wire::ParsedFrame f = wire::parse_frame(frame.data(), frame.size());
  ASSERT_TRUE(f.ok()) << f.detail;
  EXPECT_EQ(f.header.element_count, h.element_count);

  // An anchor's weight is +0.0, as the wire requires.
  const wire::FrameHeader a =
      chunk_header(topo, 0, wire::MsgType::kAnchor, 8, plan, 0, CodecId::kFp32);
  uint64_t bits = 1;
  std::memcpy(&bits, &a.weight, sizeof bits);
  EXPECT_EQ(bits, 0u);
}

}  // namespace
}  // namespace fedwan::node
