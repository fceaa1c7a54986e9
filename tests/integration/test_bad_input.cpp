// Hostile and broken peers: an aggregator refuses them with a clear reason,
// counts nothing they sent, and keeps serving the honest sites to a result
// equal to the reference.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include <zmq.hpp>

#include "harness/federation_fixture.hpp"
#include "harness/reference_federation.hpp"
#include "common/sha256.hpp"
#include "runtime/node_frames.hpp"
#include "wire/frame.hpp"

namespace fedwan::testing {
namespace {

constexpr uint64_t kSeed = 11;
constexpr size_t kParams = 3000;

// A site driven frame by frame from the test, able to misbehave.
class RawSite {
 public:
  RawSite(zmq::context_t& ctx, const Topology& topo, const std::string& id)
      : topo_(topo), self_(topo.node(id)), sock_(ctx, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::routing_id, id);
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::rcvtimeo, 10000);
    sock_.connect(topo.node(self_.parent_index).endpoint);
  }

  void send(const std::vector<uint8_t>& frame) {
    sock_.send(zmq::buffer(frame), zmq::send_flags::none);
  }

  // Next frame from the parent (fails the test on timeout).
  wire::ParsedFrame recv(std::vector<uint8_t>* storage) {
    zmq::message_t msg;
    EXPECT_TRUE(sock_.recv(msg).has_value()) << "no frame from the parent";
    storage->assign(static_cast<uint8_t*>(msg.data()),
                    static_cast<uint8_t*>(msg.data()) + msg.size());
    return wire::parse_frame(storage->data(), storage->size());
  }

  void hello(const std::vector<float>& model) {
    wire::HelloPayload h;
    h.node_id = self_.id;
    h.topology_digest = topo_.digest();
    h.model_digest = sha256(model.data(), model.size() * sizeof(float));
    wire::FrameHeader hd = node_header(topo_, self_.index, wire::MsgType::kHello, 0);
    hd.total_elements = kParams;
    send(make_frame(hd, wire::encode_hello(h)));
  }

  std::vector<uint8_t> delta(uint64_t round, uint32_t chunk, uint32_t count, uint32_t n,
                             uint32_t claimed_n) {
    const Codec& fp32 = codec_by_name("fp32");
    std::vector<float> zeros(n, 0.0f);
    std::vector<uint8_t> payload(fp32.encoded_size(n));
    fp32.encode(zeros.data(), n, nullptr, payload.data());
    wire::FrameHeader h = node_header(topo_, self_.index, wire::MsgType::kDelta, round);
    h.codec = static_cast<uint8_t>(CodecId::kFp32);
    h.chunk_index = chunk;
    h.chunk_count = count;
    h.element_count = claimed_n;
    h.total_elements = kParams;
    h.weight = self_.weight;
    std::vector<uint8_t> f = make_frame(h, payload);
    if (claimed_n != n) {
      // Re-encode the header so the payload length stays self-consistent.
      h.payload_length = static_cast<uint32_t>(fp32.encoded_size(claimed_n));
      payload.resize(h.payload_length);
      f = wire::encode_frame(h, payload.data(), payload.size());
    }
    return f;
  }

 private:
  const Topology& topo_;
  const NodeSpec& self_;
  zmq::socket_t sock_;
};

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
  std::vector<std::string> errors;
  std::mutex mu;
  auto guard = [&](const std::string& who, auto fn) {
    return std::thread([&, who, fn] {
      try {
        fn();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(who + ": " + e.what());
      }
    });
  };
  std::vector<std::thread> threads;
  threads.push_back(guard("root", [&] {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "root";
    o.initial_model = init;
    o.join_timeout = std::chrono::seconds(20);
    root_summary = Aggregator(std::move(o)).run();
  }));
  threads.push_back(guard("region-0", [&] {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = "region-0";
    o.join_timeout = std::chrono::seconds(20);
    region_summary = Aggregator(std::move(o)).run();
  }));
  threads.push_back(guard("site-0", [&] {
    SiteOptions o;
    o.topology = topo;
    o.node_id = "site-0";
    o.join_timeout = std::chrono::seconds(20);
    o.round_timeout = std::chrono::seconds(20);
    SiteCore site(std::move(o), honest_final.data(), honest_final.size());
    SyncResult r = site.join();
    while (!r.finished) {
      synthetic::local_steps(honest_final.data(), kParams, topo.node("site-0").index, 2, kSeed);
      r = site.sync();
    }
  }));

  zmq::context_t ctx;
  std::vector<uint8_t> buf;

  // A node that is not in the topology is refused by name.
  {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, "intruder");
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 10000);
    s.connect(topo.node("region-0").endpoint);
    wire::FrameHeader h = node_header(topo, 99, wire::MsgType::kHello, 0);
    s.send(zmq::buffer(make_frame(h, {})), zmq::send_flags::none);
    zmq::message_t reply;
    ASSERT_TRUE(s.recv(reply).has_value());
    const auto f = wire::parse_frame(static_cast<uint8_t*>(reply.data()), reply.size());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f.header.type, wire::MsgType::kReject);
    const std::string why(reinterpret_cast<const char*>(f.payload), f.payload_size);
    EXPECT_NE(why.find("'intruder' is not a child of 'region-0'"), std::string::npos) << why;
  }

  // The rogue site joins properly...
  RawSite rogue(ctx, topo, "site-1");
  rogue.hello(init);
  wire::ParsedFrame f = rogue.recv(&buf);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f.header.type, wire::MsgType::kWelcome);

  // ...then sends a frame of an unknown protocol version: dropped, no reply.
  std::vector<uint8_t> bad = rogue.delta(0, 0, 3, 1024, 1024);
  bad[4] = 99;
  rogue.send(bad);
  // ...and a delta whose element count disagrees with the chunk plan.
  rogue.send(rogue.delta(0, 2, 3, 952, 1000));
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
      rogue.send(rogue.delta(round, c, 3, n, n));
    }
    for (int got = 0; got < 3;) {
      f = rogue.recv(&buf);
      ASSERT_TRUE(f.ok());
      if (f.header.type == wire::MsgType::kAnchor) ++got;
    }
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(errors.empty()) << errors.front();

  // Nothing the rogue sent while broken was counted: the result equals a
  // federation where site-1 simply never moved.
  const ReferenceResult ref = run_reference(topo, init, [&](uint32_t site, uint64_t, auto& p) {
    if (site != rogue_index) synthetic::local_steps(p.data(), p.size(), site, 2, kSeed);
  });
  ASSERT_EQ(root_summary.global_model.size(), ref.global.size());
  EXPECT_EQ(0, std::memcmp(root_summary.global_model.data(), ref.global.data(),
                           ref.global.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(honest_final.data(), ref.held.data(), ref.held.size() * sizeof(float)));
  // Intruder hello, unknown version, wrong element count.
  EXPECT_GE(region_summary.rejected_frames, 3u);
}

}  // namespace
}  // namespace fedwan::testing
