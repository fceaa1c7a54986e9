// Links striped over several TCP connections (LinkOptions::streams): real
// sockets and real TLS sessions (NodeSecurity, as a node sets them up),
// with one connection slowed or lossy by the fault-injecting transport.
// Chunks arrive as they come while checkpoint pieces keep their order,
// both ways, across key updates; a lost frame is given up after the wait; what the topology does
// not allow, or what is not a sealed frame, is refused on a further
// connection, and a sealed frame there before any session (the parent
// restarted) is of another session; plaintext links cannot be striped.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "striped_links_fixture.hpp"

namespace fedwan::transport {
namespace {

using namespace striped;  // NOLINT: the fixture

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
  const uint64_t other_session = children_->counters().other_session;
  // Anyone can connect as "a~1": a plain frame, and a frame dressed as
  // sealed that the session's keys do not open, are dropped there (the
  // latter, whose key epoch is none of the session's, as a frame of
  // another session, this early in the session).
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
  ASSERT_TRUE(pump(*child, [&] {
    return children_->counters().rejected >= rejected + 1 &&
           children_->counters().other_session >= other_session + 1;
  }));
  EXPECT_EQ(up_.size(), 4u) << "nothing of the intruder's went up";
  EXPECT_NE(drops_.back().find("only sealed frames of an established session"), std::string::npos)
      << drops_.back();
  intruder.reset();
  // "a~1" is not a's connection: a's are under its link's tag, which the
  // intruder did not have, so nothing of a's was cut.
  for (uint32_t n = 0; n < 12; ++n) {
    ASSERT_TRUE(pump(*child, [&] {
      return child->try_send(numbered(*topo_, topo_->node("a").index, 50 + n)).has_value();
    }));
  }
  ASSERT_TRUE(pump(*child, [&] { return up_.size() == 16; })) << up_.size();
  EXPECT_FALSE(children_->suspended("a"));

  // Someone on the path sees the tag (ZeroMQ's handshake is in the clear)
  // and may take a's second connection over: what a sends on it is lost.
  // The parent finds the gap and suspends a's session, so that a hears
  // nothing more and reconnects.
  intruder = transport_->connect(endpoint(), child->routing_id(1), {});
  const auto taken_end = Clock::now() + 2s;
  while (intruder->try_send("", plain.data(), plain.size()) != SendResult::kSent &&
         Clock::now() < taken_end) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(pump(*child, [&] { return children_->counters().rejected >= rejected + 2; }));
  intruder.reset();
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

TEST_F(StripedLinks, WhatAChildSealedBeforeItsParentRestartedIsOfAnotherSessionOnEveryConnection) {
  start_parent();
  auto child = connect("a", 2);
  exchange(*child, "a", 4);
  // The parent restarts on its port: the child's connections come back to
  // the new process on their own, and until the child notices, it goes on
  // sealing for the session the parent no longer has, over both of them.
  drops_.clear();
  restart_parent();
  const uint32_t sender = topo_->node("a").index;
  uint32_t sent = 0;
  ASSERT_TRUE(pump(*child,
                   [&] {
                     if (sent < 40 && child->try_send(numbered(*topo_, sender, 100 + sent))) ++sent;
                     return sent == 40 && children_->counters().other_session >= 20;
                   }))
      << "other session " << children_->counters().other_session;
  EXPECT_EQ(up_.size(), 4u) << "nothing of the old session is taken";
  EXPECT_EQ(children_->counters().rejected, 0u) << "nothing taken for an attack";
  EXPECT_TRUE(drops_.empty()) << "no handshake refused on a further connection: " << drops_[0];
  EXPECT_FALSE(children_->established("a"));
  // The new process tells the child it has no session with it (on its
  // first connection, whichever one the child's frame came on), at most
  // once a second: the child goes on sending, as its heartbeats would.
  auto next = Clock::now();
  ASSERT_TRUE(pump(*child, [&] {
    if (Clock::now() >= next) {
      (void)child->try_send(numbered(*topo_, sender, 200 + sent++));
      next = Clock::now() + 200ms;
    }
    return child->security().peer_without_session().has_value();
  })) << "the child was never told its parent holds no session";
  EXPECT_TRUE(child->established()) << "the word alone ends nothing";

  // What is not sealed stays refused on a further connection, as before.
  auto intruder = transport_->connect(endpoint(), "a~1", {});
  const std::vector<uint8_t> plain = numbered(*topo_, sender, 999);
  const auto end = Clock::now() + 2s;
  while (intruder->try_send("", plain.data(), plain.size()) != SendResult::kSent &&
         Clock::now() < end) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(pump(*child, [&] { return children_->counters().rejected >= 1; }));
  ASSERT_FALSE(drops_.empty());
  EXPECT_NE(drops_.back().find("only sealed frames of an established session"), std::string::npos)
      << drops_.back();
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
  // Failed, it delivers nothing more: an owner polling it until its
  // reconnect is due waits on it (its timeout) instead of spinning, and its
  // connections, whatever they still hold, wake no wait.
  EXPECT_TRUE(child->failed());
  std::vector<Transport::Interest> interests;
  child->watch(&interests, /*writable=*/true);
  EXPECT_TRUE(interests.empty());
  Incoming in;
  const auto start = Clock::now();
  EXPECT_THROW(child->recv(&in, 150ms), CryptoError);
  EXPECT_GE(Clock::now() - start, 150ms) << "it said so at once again: an owner would spin";
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

TEST_F(StripedLinks, AChildSendsItsNextFrameOnTheConnectionItJustOpenedSoItsParentWidens) {
  // c opens more connections after the last frame it had to send was
  // queued on its first (an update's tail): its parent, which sends on as
  // many connections as it saw frames come over, would send the next
  // anchor down on one. The next frame c sends goes on the newest.
  start_parent();
  auto child = connect("c", 4, {}, 5000ms, /*adaptive=*/true);
  const uint32_t sender = topo_->node("c").index;
  uint32_t sent = 0;
  // As in the test above, but no frame is sent once it has more.
  const auto run = [&](Millis how_long) {
    const auto end = Clock::now() + how_long;
    while (Clock::now() < end && child->streams() == 1) {
      while (child->streams() == 1 && child->try_send(numbered(*topo_, sender, sent, 65536))) {
        ++sent;
      }
      Incoming in;
      for (int i = 0; i < 2 && children_->recv(&in, 0ms); ++i) up_.push_back(number_of(in));
      while (child->streams() == 1 && child->recv(&in, 0ms)) {
      }
      std::this_thread::sleep_for(1ms);
    }
  };
  run(1000ms);
  faults_->report_loss(true);
  run(10000ms);
  faults_->report_loss(false);
  ASSERT_EQ(child->streams(), 4u);
  ASSERT_TRUE(pump(*child, [&] { return up_.size() >= sent; }));
  ASSERT_EQ(children_->width_of("c"), 1u) << "every frame so far came over the first";
  // One more frame, as a heartbeat would be: over the newest connection.
  ASSERT_TRUE(pump(
      *child, [&] { return child->try_send(numbered(*topo_, sender, sent, 3000)).has_value(); }));
  ++sent;
  ASSERT_TRUE(pump(*child, [&] { return up_.size() >= sent; }));
  EXPECT_EQ(children_->width_of("c"), 4u);
  EXPECT_EQ(sorted(up_), iota(sent));
  // And the parent's frames go down over them, all of them arriving.
  for (uint32_t i = 0; i < 12; ++i) {
    ASSERT_TRUE(pump(*child, [&] {
      return children_->try_send("c", numbered(*topo_, topo_->root().index, i, 3000)).has_value();
    }));
  }
  ASSERT_TRUE(pump(*child, [&] { return down_.size() >= 12; }));
  EXPECT_EQ(sorted(down_), iota(12));
  EXPECT_EQ(child->reordering().gaps_skipped, 0u);
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
