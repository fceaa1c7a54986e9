// SecureChannel without sockets: a child and a parent channel exchange their
// messages in memory, so the handshake, authorization, sealing, rekeying and
// re-handshake logic is tested deterministically.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "fedwan/error.hpp"
#include "security/aead.hpp"
#include "security/authorization.hpp"
#include "security/certs.hpp"
#include "transport/secure_channel.hpp"
#include "wire/frame.hpp"
#include "wire/frame_order.hpp"

namespace fedwan::transport {
namespace {

namespace fs = std::filesystem;

const char* kYaml = R"(job: unit-tls
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/unit-tls-root"}
  - {id: eu, role: region, parent: root, endpoint: "ipc:///tmp/unit-tls-eu"}
  - {id: a, role: site, parent: eu}
  - {id: b, role: site, parent: eu}
)";

class SecureChannelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    topo_ = new Topology(Topology::parse(kYaml));
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("fedwan-unit-tls-" + std::to_string(std::random_device{}())));
    security::provision_federation(*topo_, dir_->string());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete topo_;
  }

  SecureChannelConfig config(const std::string& node, bool is_client,
                             security::AeadAlgorithm cipher = security::AeadAlgorithm::kAes256Gcm) {
    SecureChannelConfig c;
    c.tls = std::make_shared<security::TlsContext>((*dir_ / node).string());
    c.cipher = cipher;
    c.job_id = topo_->job_id();
    const NodeSpec* self = &topo_->node(node);
    c.self_index = self->index;
    const Topology* t = topo_;
    if (is_client) {
      c.authorize = [t, self](const security::NodeIdentity& cert, const std::string&) {
        return security::authorize_parent(*t, *self, cert);
      };
    } else {
      c.authorize = [t, self](const security::NodeIdentity& cert, const std::string& claimed) {
        return security::authorize_child(*t, *self, cert, claimed);
      };
    }
    c.on_event = [this](const LinkEvent& e) { events_.push_back(e); };
    return c;
  }

  // Delivers every pending message both ways until nothing moves. Returns
  // the data frames each side received.
  void pump(SecureChannel& child, SecureChannel& parent, SecurityReplies to_parent,
            SecurityReplies to_child = {}) {
    for (int guard = 0; guard < 20 && (!to_parent.empty() || !to_child.empty()); ++guard) {
      SecurityReplies next_child, next_parent;
      for (auto& m : to_parent) deliver(parent, m, &next_child);
      for (auto& m : to_child) deliver(child, m, &next_parent);
      to_parent = std::move(next_parent);
      to_child = std::move(next_child);
    }
  }
  ChannelSecurity::Inbound deliver(SecureChannel& ch, std::vector<uint8_t>& m, SecurityReplies* out,
                                   std::string* why_out = nullptr) {
    size_t frame_size = 0;
    std::string why;
    const auto r = ch.receive(m.data(), m.size(), &frame_size, &why, out);
    if (why_out) *why_out = why;
    if (r == ChannelSecurity::Inbound::kFrame) m.resize(frame_size);
    return r;
  }
  // Site a's channel, its session with `parent` up.
  std::unique_ptr<SecureChannel> connected_child(SecureChannel& parent) {
    auto child = std::make_unique<SecureChannel>(config("a", true), true, "eu");
    SecurityReplies first;
    child->start(&first);
    pump(*child, parent, std::move(first));
    return child;
  }
  static std::vector<uint8_t> frame(uint32_t sender, uint64_t round, uint8_t fill) {
    wire::FrameHeader h;
    h.type = wire::MsgType::kTelemetry;
    h.job_id = topo_->job_id();
    h.sender = sender;
    h.round = round;
    std::vector<uint8_t> payload(24, fill);
    return wire::encode_frame(h, payload.data(), payload.size());
  }
  // An opened frame with the sealer's order field cleared, as encoded.
  static std::vector<uint8_t> without_order(std::vector<uint8_t> f) {
    std::fill_n(f.begin() + wire::kOrderOffset, 4, uint8_t{0});
    return f;
  }

  static Topology* topo_;
  static fs::path* dir_;
  std::vector<LinkEvent> events_;
};
Topology* SecureChannelTest::topo_ = nullptr;
fs::path* SecureChannelTest::dir_ = nullptr;

TEST_F(SecureChannelTest, HandshakeThenFramesBothWays) {
  SecureChannel child(config("a", true), true, "endpoint-of-eu");
  SecureChannel parent(config("eu", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  EXPECT_FALSE(child.established());
  pump(child, parent, std::move(first));
  ASSERT_TRUE(parent.established());
  ASSERT_TRUE(child.established());
  EXPECT_EQ(parent.peer_identity()->node_id, "a");
  EXPECT_EQ(child.peer_identity()->node_id, "eu");
  int accepted = 0;
  for (const LinkEvent& e : events_) accepted += e.kind == LinkEvent::Kind::kHandshakeAccepted;
  EXPECT_EQ(accepted, 2);

  for (uint8_t i = 0; i < 5; ++i) {
    const std::vector<uint8_t> plain = frame(2, i, i);
    std::vector<uint8_t> up = plain;
    child.seal(up);
    EXPECT_EQ(up.size(), plain.size() + security::kSealTrailer);
    SecurityReplies none;
    ASSERT_EQ(deliver(parent, up, &none), ChannelSecurity::Inbound::kFrame);
    EXPECT_EQ(without_order(up), plain);
    std::vector<uint8_t> down = frame(1, i, 0x55);
    const std::vector<uint8_t> down_plain = down;
    parent.seal(down);
    ASSERT_EQ(deliver(child, down, &none), ChannelSecurity::Inbound::kFrame);
    EXPECT_EQ(without_order(down), down_plain);
    // The sealer's order tag, authenticated: the parent sealed its
    // confirmation (a barrier) before these.
    const auto order = child.last_order();
    ASSERT_TRUE(order.has_value());
    EXPECT_EQ(order->tag.barriers, 1u);
    EXPECT_EQ(order->seq, i + 1u);
  }
}

TEST_F(SecureChannelTest, ChildChoosesTheCipher) {
  SecureChannel child(config("a", true, security::AeadAlgorithm::kChaCha20Poly1305), true, "eu");
  SecureChannel parent(config("eu", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  pump(child, parent, std::move(first));
  ASSERT_TRUE(child.established() && parent.established());
  std::vector<uint8_t> up = frame(2, 0, 7);
  child.seal(up);
  SecurityReplies none;
  EXPECT_EQ(deliver(parent, up, &none), ChannelSecurity::Inbound::kFrame);
  EXPECT_EQ(events_.back().cipher, "chacha20-poly1305");
}

// The cipher travels in the ClientHello frame's header, before anything is
// authenticated. An attacker on the path who rewrites it (here: AES-GCM to
// ChaCha20) must not get a session with a cipher the child did not choose:
// the cipher is the key exporter's context, so the two ends derive
// different keys and the parent's sealed confirmation fails at the child.
TEST_F(SecureChannelTest, ACipherRewrittenOnThePathBreaksTheSession) {
  SecureChannel child(config("a", true, security::AeadAlgorithm::kAes256Gcm), true, "eu");
  SecureChannel parent(config("eu", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0][6], static_cast<uint8_t>(security::AeadAlgorithm::kAes256Gcm));
  first[0][6] = static_cast<uint8_t>(security::AeadAlgorithm::kChaCha20Poly1305);
  pump(child, parent, std::move(first));
  EXPECT_FALSE(child.established());
  // Nothing the parent seals for this session opens at the child.
  if (parent.established()) {
    std::vector<uint8_t> down = frame(1, 0, 0x55);
    parent.seal(down);
    SecurityReplies none;
    EXPECT_EQ(deliver(child, down, &none), ChannelSecurity::Inbound::kRejected);
  }
}

TEST_F(SecureChannelTest, ParentRefusalReachesTheChildWithItsReason) {
  // Site b's credentials, claiming to be a on the link.
  SecureChannel child(config("b", true), true, "eu");
  SecureChannel parent(config("eu", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  pump(child, parent, std::move(first));
  EXPECT_FALSE(parent.established());
  EXPECT_FALSE(child.established());
  EXPECT_NE(child.failure().find("node id mismatch"), std::string::npos) << child.failure();
  std::vector<uint8_t> data = frame(3, 0, 0);
  EXPECT_THROW(child.seal(data), TransportError);
}

TEST_F(SecureChannelTest, ChildRefusesAParentThatIsNotItsOwn) {
  // Site a reaches the root instead of its region.
  SecureChannel child(config("a", true), true, "root");
  SecureChannel parent(config("root", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  pump(child, parent, std::move(first));
  EXPECT_FALSE(child.established());
  EXPECT_FALSE(parent.established());  // the child withheld its last flight
  EXPECT_NE(child.failure().find("reports to 'eu'"), std::string::npos) << child.failure();
}

TEST_F(SecureChannelTest, PlaintextFrameIsRefusedAndTheSenderTold) {
  SecureChannel parent(config("eu", false), false, "a");
  std::vector<uint8_t> plain = frame(2, 0, 1);
  SecurityReplies out;
  std::string why;
  EXPECT_EQ(deliver(parent, plain, &out, &why), ChannelSecurity::Inbound::kRejected);
  EXPECT_NE(why.find("requires mutual TLS"), std::string::npos) << why;
  ASSERT_EQ(out.size(), 1u);
  const wire::ParsedFrame f = wire::parse_frame(out[0].data(), out[0].size());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.header.type, wire::MsgType::kReject);
}

TEST_F(SecureChannelTest, RekeyingKeepsFramesFlowing) {
  SecureChannelConfig cc = config("a", true);
  cc.rekey.max_frames = 3;
  SecureChannel child(cc, true, "eu");
  SecureChannel parent(config("eu", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  pump(child, parent, std::move(first));
  ASSERT_TRUE(child.established());
  for (uint8_t i = 0; i < 20; ++i) {
    std::vector<uint8_t> up = frame(2, i, i);
    child.seal(up);
    SecurityReplies none;
    ASSERT_EQ(deliver(parent, up, &none), ChannelSecurity::Inbound::kFrame) << int{i};
  }
  EXPECT_GE(child.sealer()->epoch(), 6u);
}

TEST_F(SecureChannelTest, NewHandshakeReplacesKeysOnlyWhenComplete) {
  SecureChannel parent(config("eu", false), false, "a");
  auto child = connected_child(parent);
  std::vector<uint8_t> old_frame = frame(2, 1, 9);
  child->seal(old_frame);

  // The child restarts; its first flight alone does not drop the session.
  auto again = std::make_unique<SecureChannel>(config("a", true), true, "eu");
  SecurityReplies hello;
  again->start(&hello);
  SecurityReplies replies;
  ASSERT_EQ(deliver(parent, hello[0], &replies), ChannelSecurity::Inbound::kConsumed);
  EXPECT_TRUE(parent.established());
  std::vector<uint8_t> still = old_frame;
  SecurityReplies none;
  EXPECT_EQ(deliver(parent, still, &none), ChannelSecurity::Inbound::kFrame);

  pump(*again, parent, {}, std::move(replies));
  ASSERT_TRUE(again->established());
  // A frame of the old session no longer opens: it is one of another
  // session, told apart by its key epoch.
  std::vector<uint8_t> replayed = old_frame;
  std::string why;
  EXPECT_EQ(deliver(parent, replayed, &none, &why), ChannelSecurity::Inbound::kOtherSession);
  EXPECT_NE(why.find("another session"), std::string::npos) << why;
  std::vector<uint8_t> fresh = frame(2, 2, 3);
  again->seal(fresh);
  EXPECT_EQ(deliver(parent, fresh, &none), ChannelSecurity::Inbound::kFrame);
}

// Opening on other threads (ChildrenLink's): detached frames open as
// receive() opens them, in the order finished, with the same refusals.
TEST_F(SecureChannelTest, DetachedFramesOpenAsReceivedOnesDo) {
  SecureChannel child(config("a", true), true, "eu");
  SecureChannel parent(config("eu", false), false, "a");
  SecurityReplies first;
  child.start(&first);
  EXPECT_EQ(parent.detach(first[0].data(), first[0].size()), nullptr) << "a handshake message";
  pump(child, parent, std::move(first));
  ASSERT_TRUE(parent.established());
  std::vector<std::vector<uint8_t>> plain, sealed;
  for (uint8_t i = 0; i < 3; ++i) {
    plain.push_back(frame(2, i, i));
    sealed.push_back(plain.back());
    child.seal(sealed.back());
  }
  // All three detached before any is finished, a copy of the second too,
  // and a copy of the third with a bit of its ciphertext flipped.
  std::vector<std::vector<uint8_t>> bytes = {sealed[0], sealed[1], sealed[1], sealed[2], sealed[2]};
  bytes[3][wire::kHeaderSize + 3] ^= 0x10;
  std::vector<std::unique_ptr<DetachedFrame>> d;
  for (auto& b : bytes) {
    d.push_back(parent.detach(b.data(), b.size()));
    ASSERT_NE(d.back(), nullptr);
  }
  std::unique_ptr<security::AeadCipher> cipher;
  const std::vector<ChannelSecurity::Inbound> expected = {
      ChannelSecurity::Inbound::kFrame, ChannelSecurity::Inbound::kFrame,
      ChannelSecurity::Inbound::kRejected, ChannelSecurity::Inbound::kRejected,
      ChannelSecurity::Inbound::kFrame};
  const std::vector<std::string> why_expected = {"", "", "replay", "bad tag", ""};
  const std::vector<size_t> plain_of = {0, 1, 1, 2, 2};
  for (size_t i = 0; i < bytes.size(); ++i) {
    const bool ok = d[i]->run(bytes[i].data(), &cipher);
    size_t frame_size = 0;
    std::string why;
    EXPECT_EQ(parent.finish(*d[i], ok, bytes[i].data(), bytes[i].size(), &frame_size, &why),
              expected[i])
        << i;
    EXPECT_NE(why.find(why_expected[i]), std::string::npos) << i << ": " << why;
    if (expected[i] != ChannelSecurity::Inbound::kFrame) continue;
    bytes[i].resize(frame_size);
    EXPECT_EQ(without_order(bytes[i]), plain[plain_of[i]]) << i;
    ASSERT_TRUE(parent.last_order().has_value());
    EXPECT_EQ(parent.last_order()->seq, plain_of[i]);
  }
  EXPECT_EQ(events_.back().kind, LinkEvent::Kind::kFrameRejected);
  // Recorded: a copy that comes again is not detached; receive() refuses it.
  std::vector<uint8_t> again = sealed[0];
  EXPECT_EQ(parent.detach(again.data(), again.size()), nullptr);
  SecurityReplies none;
  EXPECT_EQ(deliver(parent, again, &none), ChannelSecurity::Inbound::kRejected);
}

TEST_F(SecureChannelTest, AFrameDetachedBeforeNewKeysIsRefusedAfter) {
  SecureChannel parent(config("eu", false), false, "a");
  auto child = connected_child(parent);
  std::vector<uint8_t> old_frame = frame(2, 1, 9);
  child->seal(old_frame);
  auto d = parent.detach(old_frame.data(), old_frame.size());
  ASSERT_NE(d, nullptr);
  std::unique_ptr<security::AeadCipher> cipher;
  const bool ok = d->run(old_frame.data(), &cipher);
  EXPECT_TRUE(ok);
  auto again = std::make_unique<SecureChannel>(config("a", true), true, "eu");
  SecurityReplies hello;
  again->start(&hello);
  pump(*again, parent, std::move(hello));
  ASSERT_TRUE(again->established());
  size_t frame_size = 0;
  std::string why;
  EXPECT_EQ(parent.finish(*d, ok, old_frame.data(), old_frame.size(), &frame_size, &why),
            ChannelSecurity::Inbound::kOtherSession);
  EXPECT_NE(why.find("ended session"), std::string::npos) << why;
  EXPECT_EQ(events_.back().kind, LinkEvent::Kind::kFrameOfOtherSession);
  // Nor does another channel's detached frame finish here.
  SecureChannel other(config("eu", false), false, "b");
  EXPECT_EQ(other.finish(*d, true, old_frame.data(), old_frame.size(), &frame_size, &why),
            ChannelSecurity::Inbound::kRejected);
}

// A child restarts: what its parent sealed for the last session (before it
// saw the new ClientHello, and while the new handshake ran) reaches the new
// process before it has keys, while it waits for the parent's confirmation
// and once the new session is up; what the old process sealed reaches the
// parent after the new keys. Each is dropped as a frame of another session,
// never reported as a rejected (tampered) frame, and the new session's own
// frames go through.
TEST_F(SecureChannelTest, WhatARestartLeavesOnTheWayIsOfAnotherSession) {
  for (int rekeys : {0, 3}) {
    SCOPED_TRACE("old session rekeyed " + std::to_string(rekeys) + " times");
    events_.clear();
    SecureChannelConfig parent_config = config("eu", false);
    parent_config.rekey.max_frames = rekeys == 0 ? (uint64_t{1} << 32) : 2;
    SecureChannel parent(parent_config, false, "a");
    auto old_child = connected_child(parent);
    ASSERT_TRUE(old_child->established() && parent.established());
    SecurityReplies none;
    for (int i = 0; i < 2 * rekeys; ++i) {
      std::vector<uint8_t> f = frame(1, 1, 1);
      parent.seal(f);
      ASSERT_EQ(deliver(*old_child, f, &none), ChannelSecurity::Inbound::kFrame);
    }
    auto sealed_down = [&] {
      std::vector<uint8_t> f = frame(1, 2, 0x5a);
      parent.seal(f);
      return f;
    };
    std::vector<uint8_t> old_up = frame(2, 2, 0x33);
    old_child->seal(old_up);
    std::vector<uint8_t> before_hello = sealed_down();

    auto child = std::make_unique<SecureChannel>(config("a", true), true, "eu");
    SecurityReplies hello;
    child->start(&hello);
    std::string why;
    EXPECT_EQ(deliver(*child, before_hello, &none, &why), ChannelSecurity::Inbound::kOtherSession)
        << why;
    // The parent answers the ClientHello; until the child's last flight it
    // still seals under the old keys.
    SecurityReplies to_child;
    for (auto& m : hello) deliver(parent, m, &to_child);
    std::vector<uint8_t> during = sealed_down();
    SecurityReplies to_parent;
    for (auto& m : to_child) deliver(*child, m, &to_parent);
    EXPECT_FALSE(child->established());  // waits for the parent's confirmation
    EXPECT_EQ(deliver(*child, during, &none, &why), ChannelSecurity::Inbound::kOtherSession) << why;
    std::vector<uint8_t> late = sealed_down();
    pump(*child, parent, std::move(to_parent));
    ASSERT_TRUE(child->established() && parent.established());
    EXPECT_EQ(deliver(*child, late, &none, &why), ChannelSecurity::Inbound::kOtherSession) << why;
    EXPECT_EQ(deliver(parent, old_up, &none, &why), ChannelSecurity::Inbound::kOtherSession) << why;

    std::vector<uint8_t> down = sealed_down();
    const std::vector<uint8_t> plain_down = frame(1, 2, 0x5a);
    EXPECT_EQ(deliver(*child, down, &none), ChannelSecurity::Inbound::kFrame);
    EXPECT_EQ(without_order(down), plain_down);
    std::vector<uint8_t> up = frame(2, 2, 0x44);
    child->seal(up);
    EXPECT_EQ(deliver(parent, up, &none), ChannelSecurity::Inbound::kFrame);

    size_t other = 0;
    for (const LinkEvent& e : events_) {
      EXPECT_NE(e.kind, LinkEvent::Kind::kFrameRejected) << e.reason;
      other += e.kind == LinkEvent::Kind::kFrameOfOtherSession ? 1 : 0;
    }
    EXPECT_EQ(other, 4u);
  }
}

// What a link can tell was sealed before this end had a session (a striped
// child's further connection, after its parent restarted): of another
// session, as such a frame on the first connection is; on a plaintext
// link, where nothing is sealed, a rejected frame.
TEST_F(SecureChannelTest, ASealedMessageBeforeAnySessionIsOfAnotherSessionUnlessNothingIsSealed) {
  SecureChannel parent(config("eu", false), false, "a");
  std::string why;
  SecurityReplies told;
  EXPECT_EQ(parent.sealed_before_any_session("sealed on a further connection", 92, &why, &told),
            ChannelSecurity::Inbound::kOtherSession);
  EXPECT_EQ(why, "sealed on a further connection");
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_.back().kind, LinkEvent::Kind::kFrameOfOtherSession);
  EXPECT_EQ(events_.back().bytes, 92u);
  EXPECT_FALSE(parent.established());
  // The child is told it has no session here (on its first connection).
  ASSERT_EQ(told.size(), 1u);
  EXPECT_TRUE(is_no_session_frame(told[0]));

  std::vector<LinkEvent> plain_events;
  PlaintextSecurity plain(
      7, 0, [&](const LinkEvent& e) { plain_events.push_back(e); }, "a");
  SecurityReplies plain_told;
  EXPECT_EQ(
      plain.sealed_before_any_session("sealed on a further connection", 92, &why, &plain_told),
      ChannelSecurity::Inbound::kRejected);
  EXPECT_TRUE(plain_told.empty());
  ASSERT_EQ(plain_events.size(), 1u);
  EXPECT_EQ(plain_events[0].kind, LinkEvent::Kind::kFrameRejected);
  EXPECT_EQ(plain_events[0].reason, "sealed on a further connection");
  EXPECT_EQ(plain_events[0].bytes, 92u);
}

// A parent that restarted holds no session with its child: the child's
// sealed frames are of another session, and the first of them in a second
// is answered with a plain "no session here". A child whose session is up
// notes when it heard that (nothing else changes: anyone could say it); a
// child in a handshake, or a parent, does not take it from a peer.
TEST_F(SecureChannelTest, AParentWithoutTheSessionSaysSoAndTheChildOnlyNotesIt) {
  SecureChannel parent(config("eu", false), false, "a");
  auto child = connected_child(parent);
  ASSERT_TRUE(child->established());
  ASSERT_FALSE(child->peer_without_session());

  SecureChannel restarted(config("eu", false), false, "a");
  std::vector<uint8_t> beat = frame(2, 1, 0x33);
  child->seal(beat);
  std::vector<uint8_t> beat_again = beat;
  events_.clear();
  SecurityReplies replies;
  std::string why;
  EXPECT_EQ(deliver(restarted, beat, &replies, &why), ChannelSecurity::Inbound::kOtherSession);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(is_no_session_frame(replies[0]));
  const wire::ParsedFrame said = wire::parse_frame(replies[0].data(), replies[0].size());
  ASSERT_TRUE(said.ok()) << said.detail;
  EXPECT_EQ(said.header.type, wire::MsgType::kHandshake);
  EXPECT_EQ(said.header.flags, wire::kFlagNoSession);
  EXPECT_EQ(said.payload_size, 0u);
  // Within the second: nothing more said, the frame still dropped as of
  // another session.
  SecurityReplies more;
  EXPECT_EQ(deliver(restarted, beat_again, &more, &why), ChannelSecurity::Inbound::kOtherSession);
  EXPECT_TRUE(more.empty());

  events_.clear();
  SecurityReplies none;
  EXPECT_EQ(deliver(*child, replies[0], &none, &why), ChannelSecurity::Inbound::kConsumed);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(child->established());
  ASSERT_TRUE(child->peer_without_session());
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].kind, LinkEvent::Kind::kPeerWithoutSession);

  // A child still in its handshake does not fail on it (its new session is
  // the answer), nor note it.
  SecureChannel fresh(config("a", true), true, "eu");
  SecurityReplies hello;
  fresh.start(&hello);
  std::vector<uint8_t> word = no_session_frame(topo_->job_id(), topo_->node("eu").index);
  EXPECT_EQ(deliver(fresh, word, &none, &why), ChannelSecurity::Inbound::kConsumed);
  EXPECT_TRUE(fresh.failure().empty()) << fresh.failure();
  EXPECT_FALSE(fresh.peer_without_session());
  pump(fresh, restarted, std::move(hello));
  EXPECT_TRUE(fresh.established());

  // A parent does not take it from a child, and a parent in a handshake
  // with the child says nothing.
  events_.clear();
  std::vector<uint8_t> from_child = no_session_frame(topo_->job_id(), topo_->node("a").index);
  EXPECT_EQ(deliver(parent, from_child, &none, &why), ChannelSecurity::Inbound::kRejected);
  SecureChannel handshaking(config("eu", false), false, "a");
  SecureChannel joining(config("a", true), true, "eu");
  SecurityReplies client_hello;
  joining.start(&client_hello);
  SecurityReplies server_flight;
  deliver(handshaking, client_hello[0], &server_flight);
  ASSERT_TRUE(handshaking.handshaking());
  std::vector<uint8_t> stale = frame(2, 1, 0x44);
  child->seal(stale);
  SecurityReplies quiet;
  EXPECT_EQ(deliver(handshaking, stale, &quiet, &why), ChannelSecurity::Inbound::kOtherSession);
  EXPECT_TRUE(quiet.empty());
}

// Long into a session, nothing explains a frame of another one: it is a
// rejected frame (here the grace is none at all).
TEST_F(SecureChannelTest, AFrameOfAnotherSessionLongIntoThisOneIsRejected) {
  SecureChannelConfig c = config("eu", false);
  c.other_session_grace = std::chrono::milliseconds(0);
  SecureChannel parent(c, false, "a");
  auto old_child = connected_child(parent);
  std::vector<uint8_t> old_frame = frame(2, 1, 9);
  old_child->seal(old_frame);
  auto child = connected_child(parent);
  ASSERT_TRUE(child->established());
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  events_.clear();
  SecurityReplies none;
  std::string why;
  EXPECT_EQ(deliver(parent, old_frame, &none, &why), ChannelSecurity::Inbound::kRejected);
  EXPECT_NE(why.find("into this session"), std::string::npos) << why;
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_.back().kind, LinkEvent::Kind::kFrameRejected);
}

// A frame of this session tampered with is still a rejection, whatever its
// epoch field says within the session's reach.
TEST_F(SecureChannelTest, ATamperedFrameOfThisSessionIsStillRejected) {
  SecureChannel parent(config("eu", false), false, "a");
  auto child = connected_child(parent);
  std::vector<uint8_t> up = frame(2, 1, 0x21);
  child->seal(up);
  up[wire::kHeaderSize + 3] ^= 0x01;
  events_.clear();
  SecurityReplies none;
  std::string why;
  EXPECT_EQ(deliver(parent, up, &none, &why), ChannelSecurity::Inbound::kRejected);
  EXPECT_NE(why.find("bad tag"), std::string::npos) << why;
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_.back().kind, LinkEvent::Kind::kFrameRejected);
}

}  // namespace
}  // namespace fedwan::transport
