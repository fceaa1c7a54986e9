// Links striped over several TCP connections (LinkOptions::streams): real
// sockets and real TLS sessions (NodeSecurity, as a node sets them up),
// with one connection slowed or lossy by the fault-injecting transport.
// Chunks arrive as they come while checkpoint pieces keep their order,
// both ways, across key updates; a lost frame is given up after the wait; what the topology does
// not allow, or what is not a sealed frame of the session, is refused on a
// further connection; plaintext links cannot be striped.
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

namespace fedwan::transport {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::FaultInjector;
using testing::FaultRule;
using Clock = std::chrono::steady_clock;

std::string topology_yaml(int port) {
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
std::vector<uint8_t> numbered(const Topology& topo, uint32_t sender, uint32_t n,
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

uint32_t number_of(const Incoming& in) {
  const wire::ParsedFrame f = wire::parse_frame(in.data(), in.frame_size);
  EXPECT_TRUE(f.ok()) << f.detail;
  return f.header.chunk_index;
}

std::vector<uint32_t> sorted(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The pieces (the odd numbers) among `v`, in the order they came.
std::vector<uint32_t> pieces_of(const std::vector<uint32_t>& v) {
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

  void start_parent(Millis reorder_wait = 5000ms) {
    parent_sec_ = std::make_unique<node::NodeSecurity>(options_for("root"), *topo_, topo_->root());
    LinkAdmission a = parent_sec_->children_admission();
    a.reorder_wait = reorder_wait;
    a.on_drop = [this, audit = a.on_drop](const std::string& peer, const std::string& source,
                                          const std::string& why, size_t bytes) {
      drops_.push_back(why);
      audit(peer, source, why, bytes);
    };
    children_ = std::make_unique<ChildrenLink>(*transport_, endpoint(), LinkOptions{},
                                               parent_sec_->children_factory(), a);
  }

  std::unique_ptr<ParentLink> connect(const std::string& id, int streams, SecurityOptions so = {},
                                      Millis reorder_wait = 5000ms, bool adaptive = false) {
    if (so.credentials_dir.empty() && !so.insecure_plaintext) so = options_for(id);
    child_sec_.push_back(std::make_unique<node::NodeSecurity>(so, *topo_, topo_->node(id)));
    LinkOptions o;
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

TEST_F(StripedLinks, ChunksOvertakeASlowConnectionWhilePiecesKeepTheirOrderBothWays) {
  // Every message on a's second connection is 40 ms late, both ways.
  const auto slow = faults_->add(FaultRule::delay_by(40ms).on(endpoint(), "a~1"));
  start_parent();
  // Fresh keys every 7 frames each way: frames sealed before a key update
  // arrive after frames sealed under the next key.
  SecurityOptions so = options_for("a");
  so.rekey_after_frames = 7;
  auto child = connect("a", 3, so);
  EXPECT_EQ(child->streams(), 3u);
  exchange(*child, "a", 120, /*pieces=*/true);
  EXPECT_EQ(sorted(up_), iota(120));
  EXPECT_EQ(sorted(down_), iota(120));
  EXPECT_NE(up_, iota(120)) << "chunks went on without waiting for the slow connection";
  EXPECT_EQ(pieces_of(up_), pieces_of(iota(120))) << "pieces in the order they were sent";
  EXPECT_EQ(pieces_of(down_), pieces_of(iota(120)));
  EXPECT_GT(faults_->hits(slow), 60u) << "both ways used the slow connection";
  EXPECT_GT(child->reordering().overtook, 0u) << "frames were really overtaken";
  EXPECT_GT(child->reordering().held, 0u) << "pieces waited for the pieces before them";
  EXPECT_EQ(child->reordering().gaps_skipped, 0u);
  EXPECT_EQ(children_->frames_reordering(), 0u);
  EXPECT_EQ(children_->counters().rejected, 0u);
  EXPECT_EQ(child->counters().rejected, 0u);
}

TEST_F(StripedLinks, BigFramesGoInPiecesOverEveryConnectionAndArriveWholeBothWays) {
  // Frames of 200 KB: seven pieces each, spread over a's three connections
  // (one of them slow both ways), put back together, opened, and delivered
  // as any frame: chunks as they come, pieces of a checkpoint in order.
  const auto slow = faults_->add(FaultRule::delay_by(20ms).on(endpoint(), "a~1"));
  const auto second_up = faults_->add(FaultRule::observe().on(endpoint(), "a~2").up());
  const auto second_down = faults_->add(FaultRule::observe().on(endpoint(), "a~2").down());
  start_parent();
  // Pieces only over a long link: the transport says this one is (50 ms).
  faults_->report_loss(true);
  SecurityOptions so = options_for("a");
  so.rekey_after_frames = 7;
  auto child = connect("a", 3, so);
  exchange(*child, "a", 40, /*pieces=*/true, 200'000);
  EXPECT_EQ(sorted(up_), iota(40));
  EXPECT_EQ(sorted(down_), iota(40));
  EXPECT_EQ(pieces_of(up_), pieces_of(iota(40))) << "pieces in the order they were sent";
  EXPECT_EQ(pieces_of(down_), pieces_of(iota(40)));
  // 40 frames each way, about 7 pieces each, over three connections.
  EXPECT_GT(faults_->hits(second_up), 40u) << "pieces, not frames, went over it";
  EXPECT_GT(faults_->hits(second_down), 40u);
  EXPECT_GT(faults_->hits(slow), 0u);
  EXPECT_FALSE(child->sending());
  EXPECT_FALSE(children_->sending());
  EXPECT_EQ(child->reordering().gaps_skipped, 0u);
  EXPECT_EQ(children_->counters().rejected, 0u);
  EXPECT_EQ(child->counters().rejected, 0u);
}

TEST_F(StripedLinks, PiecesThatDoNotFitOrComeFromAnUnstripedChildAreRefused) {
  start_parent();
  auto child = connect("a", 2);
  exchange(*child, "a", 4);
  // A piece that names an impossible frame, on a's further connection and
  // on its first: refused with the reason, nothing held for it.
  std::vector<uint8_t> bad(kFragmentHeaderBytes + 100, 0);
  std::memcpy(bad.data(), "FWFG", 4);
  bad[4] = 1;
  bad[16] = 0xff;  // a frame of 255 bytes in pieces of 0
  for (const char* id : {"a~1", "b"}) {
    auto intruder = transport_->connect(endpoint(), id, {});
    const auto end = Clock::now() + 2s;
    while (intruder->try_send("", bad.data(), bad.size()) != SendResult::kSent &&
           Clock::now() < end) {
      std::this_thread::sleep_for(5ms);
    }
    const size_t drops = drops_.size();
    ASSERT_TRUE(pump(*child, [&] { return drops_.size() > drops; })) << id;
    if (std::string(id) == "a~1") {
      EXPECT_NE(drops_.back().find("fragment refused"), std::string::npos) << drops_.back();
    } else {
      // b has no session and one connection: its pieces are no frames.
      EXPECT_NE(drops_.back().find("fragments come only from a child striped"), std::string::npos)
          << drops_.back();
    }
  }
  EXPECT_EQ(up_.size(), 4u);
}

TEST_F(StripedLinks, ALostFrameOnTheWayUpSuspendsTheChildsSessionUntilItReconnects) {
  // The third delta frame (a's third connection's first) never arrives: its
  // connection broke with it in flight.
  const auto lost = faults_->add(
      FaultRule::drop().on(endpoint(), "a~2").up().of_type(wire::MsgType::kDelta).first(1));
  start_parent(300ms);
  auto child = connect("a", 3);
  const auto start = Clock::now();
  const uint32_t sender = topo_->node("a").index;
  uint32_t sent = 0;
  ASSERT_TRUE(pump(*child, [&] {
    if (sent < 30 && child->try_send(numbered(*topo_, sender, sent))) ++sent;
    return children_->suspended("a");
  }));
  EXPECT_EQ(faults_->hits(lost), 1u);
  EXPECT_GE(Clock::now() - start, 300ms) << "the gap was waited for";
  ASSERT_GE(up_.size(), 2u);
  EXPECT_EQ(std::count(up_.begin(), up_.end(), 2u), 0) << "the lost chunk";
  EXPECT_GT(up_.size(), 2u) << "chunks after the lost one went on";
  EXPECT_NE(drops_.back().find("suspended until it reconnects"), std::string::npos);
  // Nothing goes down to it any more: it falls silent on its side.
  EXPECT_FALSE(children_->try_send("a", numbered(*topo_, 0, 1)).has_value());
  const size_t taken = up_.size();
  (void)pump(
      *child, [] { return false; }, 200ms);
  EXPECT_EQ(up_.size(), taken) << "nothing more of that session is taken";
  // It reconnects: a new session, served again.
  child = connect("a", 3);
  up_.clear();
  exchange(*child, "a", 12);
  EXPECT_EQ(sorted(up_), iota(12));
  EXPECT_EQ(sorted(down_), iota(12));
  EXPECT_FALSE(children_->suspended("a"));
}

TEST_F(StripedLinks, ConnectionsBeyondTheTopologysAreRefusedWithTheReason) {
  // A child under the same topology cannot get here (the digest in its
  // hello covers streams); a dishonest one can, and gets nothing through.
  start_parent();
  auto child = connect("b", 2);
  const uint32_t sender = topo_->node("b").index;
  uint32_t sent = 0;
  ASSERT_TRUE(pump(*child, [&] {
    while (sent < 10 && child->try_send(numbered(*topo_, sender, sent))) ++sent;
    return sent == 10 && up_.size() >= 5 && children_->counters().rejected >= 5;
  }));
  EXPECT_EQ(up_, (std::vector<uint32_t>{0, 2, 4, 6, 8})) << "only the first connection's";
  ASSERT_FALSE(drops_.empty());
  EXPECT_NE(drops_.back().find("connection 2 of 'b' is beyond the 1 its topology allows"),
            std::string::npos)
      << drops_.back();
}

TEST_F(StripedLinks, OnlySealedFramesOfTheSessionComeOnAFurtherConnection) {
  start_parent(300ms);
  auto child = connect("a", 2, {}, 300ms);
  exchange(*child, "a", 4);
  const uint64_t rejected = children_->counters().rejected;
  // Anyone can connect as "a~1": a plain frame, and a frame dressed as
  // sealed that the session's keys do not open, are dropped there.
  auto intruder = transport_->connect(endpoint(), "a~1", {});
  std::vector<uint8_t> plain = numbered(*topo_, topo_->node("a").index, 999);
  std::vector<uint8_t> forged = plain;
  forged[7] |= 0x80;
  forged.resize(forged.size() + 28, 0x5a);
  for (auto* m : {&plain, &forged}) {
    const auto end = Clock::now() + 2s;
    while (intruder->try_send("", m->data(), m->size()) != SendResult::kSent &&
           Clock::now() < end) {
      std::this_thread::sleep_for(5ms);
    }
  }
  ASSERT_TRUE(pump(*child, [&] { return children_->counters().rejected >= rejected + 2; }));
  EXPECT_EQ(up_.size(), 4u) << "nothing of the intruder's went up";
  EXPECT_NE(drops_.back().find("only sealed frames of an established session"), std::string::npos)
      << drops_.back();
  intruder.reset();

  // Taking "a~1" over (as anyone can take any routing id over, see
  // docs/security.md) left a's connection there cut: what a sends on it is
  // lost. The parent finds the gap and suspends a's session, so that a hears
  // nothing more and reconnects.
  uint32_t sent = 0;
  ASSERT_TRUE(pump(
      *child,
      [&] {
        if (sent < 20 && child->try_send(numbered(*topo_, topo_->node("a").index, 100 + sent)))
          ++sent;
        return children_->suspended("a");
      },
      5000ms))
      << "the lost frames went unnoticed";
  EXPECT_NE(drops_.back().find("suspended until it reconnects"), std::string::npos)
      << drops_.back();
  EXPECT_FALSE(children_->try_send("a", numbered(*topo_, 0, 7)).has_value());
  // A new link (all connections new) is one ordered link again.
  child = connect("a", 2, {}, 300ms);
  up_.clear();
  down_.clear();
  exchange(*child, "a", 8);
  EXPECT_EQ(sorted(up_), iota(8));
  EXPECT_EQ(sorted(down_), iota(8));
  EXPECT_FALSE(children_->suspended("a")) << "the new session lifted it";
}

TEST_F(StripedLinks, ALostFrameOnTheWayDownFailsTheChildsLink) {
  faults_->add(
      FaultRule::drop().on(endpoint(), "a~1").down().of_type(wire::MsgType::kDelta).first(1));
  start_parent();
  auto child = connect("a", 2, {}, 200ms);
  try {
    exchange(*child, "a", 10);
    FAIL() << "the lost frame went unnoticed";
  } catch (const CryptoError& e) {
    EXPECT_NE(std::string(e.what()).find("never arrived"), std::string::npos) << e.what();
  }
  EXPECT_EQ(child->reordering().gaps_skipped, 1u);
}

TEST_F(StripedLinks, AutoOpensMoreConnectionsOnlyOverALossyLinkThatHoldsTheSenderBack) {
  // The parent takes c's frames slowly, so c always has more to send than
  // the link takes. Without loss one connection's window is not what holds
  // it back: it keeps one. Once its connections retransmit it opens more
  // (how many it keeps is the governor's measurement: test_stream_governor).
  start_parent();
  auto child = connect("c", 4, {}, 5000ms, /*adaptive=*/true);
  EXPECT_EQ(child->streams(), 1u) << "auto starts with one connection";
  const uint32_t sender = topo_->node("c").index;
  uint32_t sent = 0;
  const auto run = [&](Millis how_long) {
    const auto end = Clock::now() + how_long;
    while (Clock::now() < end) {
      // Frames of 64 KiB: what the kernel buffers stays well inside the
      // replay window (1024 frames) on every connection.
      while (child->try_send(numbered(*topo_, sender, sent, 65536))) ++sent;
      Incoming in;
      for (int i = 0; i < 2 && children_->recv(&in, 0ms); ++i) up_.push_back(number_of(in));
      while (child->recv(&in, 0ms)) {
      }
      std::this_thread::sleep_for(1ms);
    }
  };
  run(3000ms);
  EXPECT_EQ(child->streams(), 1u) << "no loss, no more connections";
  faults_->report_loss(true);
  const auto start = Clock::now();
  while (child->streams() < 2 && Clock::now() - start < 10s) run(100ms);
  EXPECT_EQ(child->streams(), 4u)
      << "the first loss on a long link: 8 connections to start from, here its cap of 4";
  faults_->report_loss(false);
  run(500ms);
  // Everything sent arrived, over all its connections, none twice.
  ASSERT_TRUE(pump(*child, [&] { return up_.size() >= sent; }))
      << up_.size() << " of " << sent << " rejected " << children_->counters().rejected
      << " sending " << child->sending() << " reordering " << children_->frames_reordering()
      << " suspended " << children_->suspended("c") << " drops " << drops_.size()
      << (drops_.empty() ? "" : drops_.back());
  EXPECT_EQ(sorted(up_), iota(sent));
  EXPECT_EQ(child->reordering().gaps_skipped, 0u);
  EXPECT_EQ(children_->counters().rejected, 0u);
}

TEST_F(StripedLinks, APlaintextLinkCannotBeStriped) {
  start_parent();
  SecurityOptions so;
  so.insecure_plaintext = true;
  try {
    (void)connect("a", 2, so);
    FAIL() << "a plaintext link was striped";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs the secure channel"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fedwan::transport
