// A child replaces its link to its parent (it reconnects; a node that
// restarted does the same): the parent follows it to the new link's
// connections, and a connection of the replaced link, however late it
// completes at the parent (ZeroMQ closes a socket in the background, and
// may complete its handshake after the new link's), takes nothing from the
// new one. Routing ids: transport/routing_id.hpp.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "striped_links_fixture.hpp"
#include "transport/routing_id.hpp"

namespace fedwan::transport {
namespace {

using namespace striped;  // NOLINT: the fixture

TEST(RoutingId, TaggedAndUntaggedFormsParseAndAnythingElseIsRefused) {
  const std::string tag = "0123456789abcdef";
  std::string why;
  const auto first = parse_routing_id("site-1~0." + tag, &why);
  ASSERT_TRUE(first.has_value()) << why;
  EXPECT_EQ(first->node, "site-1");
  EXPECT_EQ(first->stripe, 0u);
  EXPECT_EQ(first->link, tag);
  const auto further = parse_routing_id("site-1~12." + tag, &why);
  ASSERT_TRUE(further.has_value()) << why;
  EXPECT_EQ(further->stripe, 12u);
  EXPECT_EQ(routing_id("site-1", 12, tag), "site-1~12." + tag);
  EXPECT_EQ(routing_id("site-1", 0, tag), "site-1~0." + tag);
  // The untagged forms of a node's first and further connections.
  const auto plain = parse_routing_id("site-1", &why);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->node, "site-1");
  EXPECT_EQ(plain->stripe, 0u);
  EXPECT_TRUE(plain->link.empty());
  const auto old = parse_routing_id("site-1~3", &why);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->stripe, 3u);
  EXPECT_EQ(routing_id("site-1", 0, ""), "site-1");
  EXPECT_EQ(routing_id("site-1", 3, ""), "site-1~3");
  EXPECT_EQ(untagged_routing_id("site-1~0." + tag), "site-1");
  EXPECT_EQ(untagged_routing_id("site-1~3." + tag), "site-1~3");
  for (const std::string& bad : std::vector<std::string>{
           "site-1~0", "site-1~", "site-1~01." + tag, "site-1~100." + tag, "~1." + tag,
           "site-1~1." + tag.substr(1), "site-1~1." + tag + "0", "site-1~1.0123456789ABCDEF",
           "site-1~1.", "site-1~x." + tag, "site-1~1~2", "site-1~-1"}) {
    why.clear();
    EXPECT_FALSE(parse_routing_id(bad, &why).has_value()) << bad;
    EXPECT_NE(why.find("malformed routing id"), std::string::npos) << bad;
  }
  // Each link draws its own.
  const std::string a = new_link_tag(), b = new_link_tag();
  EXPECT_EQ(a.size(), kLinkTagLength);
  EXPECT_NE(a, b);
  EXPECT_TRUE(parse_routing_id(routing_id("n", 1, a), &why).has_value()) << why;
}

// The race this guards against: a child's replaced link had connections
// reconnecting (to a parent that restarted, say) when it closed them, and
// one completes its handshake at the parent after the new link's did. Under
// one routing id for both, ZeroMQ hands the id to the late one, cutting the
// new link's connection with frames in flight: the parent then suspends the
// new session for a gap. Here the late connections are made at will, after
// the new link is up, under the routing ids the replaced link used.
TEST_F(StripedLinks, ALateConnectionOfAReplacedLinkTakesNothingFromTheNewOne) {
  start_parent(300ms);
  auto child = connect("a", 3);
  exchange(*child, "a", 6);
  std::vector<std::string> replaced;
  for (size_t k = 0; k < 3; ++k) replaced.push_back(child->routing_id(k));
  // The child reconnects: its old link goes, a new one comes.
  child->abandon();
  child = connect("a", 3);
  for (size_t k = 0; k < 3; ++k) EXPECT_NE(child->routing_id(k), replaced[k]);
  // Until the new session is up the parent's frames go to the old link,
  // which is gone: the child is not connected, as a child that restarted.
  ASSERT_TRUE(pump(*child, [&] { return child->established(); }));
  up_.clear();
  down_.clear();
  exchange(*child, "a", 6);
  // The replaced link's connections complete now, late, and say something
  // (what was queued on them: nothing of the new session).
  const uint64_t rejected = children_->counters().rejected;
  std::vector<std::unique_ptr<Socket>> late;
  const std::vector<uint8_t> plain = numbered(*topo_, topo_->node("a").index, 999);
  for (const std::string& id : replaced) {
    late.push_back(transport_->connect(endpoint(), id, {}));
    const auto end = Clock::now() + 2s;
    while (late.back()->try_send("", plain.data(), plain.size()) != SendResult::kSent &&
           Clock::now() < end) {
      std::this_thread::sleep_for(5ms);
    }
  }
  ASSERT_TRUE(pump(*child, [&] { return children_->counters().rejected >= rejected + 3; }))
      << "the late connections were not heard";
  // The new link's connections were not cut: 60 frames each way, over all
  // three, arrive whole, and the session goes on.
  const uint32_t sender = topo_->node("a").index;
  uint32_t up = 6, down = 6;
  ASSERT_TRUE(pump(*child,
                   [&] {
                     if (up < 66 && child->try_send(numbered(*topo_, sender, up))) ++up;
                     if (down < 66 &&
                         children_->try_send("a", numbered(*topo_, topo_->root().index, down)))
                       ++down;
                     return up_.size() >= 66 && down_.size() >= 66;
                   }))
      << "up " << up_.size() << " down " << down_.size() << (child->failed() ? " (failed)" : "")
      << (children_->suspended("a") ? " (suspended)" : "");
  EXPECT_EQ(sorted(up_), iota(66));
  EXPECT_EQ(sorted(down_), iota(66));
  EXPECT_FALSE(children_->suspended("a"));
  EXPECT_FALSE(child->failed());
  for (const std::string& d : drops_) {
    EXPECT_EQ(d.find("suspended"), std::string::npos) << d;
  }
}

// The parent sends to the link whose handshake made the child's session,
// not to whichever connection is newest: a child with an old link still
// open gets the parent's frames on its new one only.
TEST_F(StripedLinks, TheParentSendsToTheLinkThatMadeTheSessionAndToNoOther) {
  start_parent();
  auto old_link = connect("a", 2);
  exchange(*old_link, "a", 4);
  auto new_link = connect("a", 2);
  // Both links are served (the old one's connections stay open).
  std::vector<uint32_t> to_old;
  const auto both = [&] {
    Incoming in;
    while (old_link->recv(&in, 0ms)) to_old.push_back(number_of(in));
  };
  ASSERT_TRUE(pump(*new_link, [&] {
    both();
    return new_link->established();
  }));
  // From the new session on, only the new link gets frames.
  to_old.clear();
  up_.clear();
  down_.clear();
  const uint32_t sender = topo_->node("a").index;
  uint32_t up = 0, down = 0;
  ASSERT_TRUE(pump(*new_link,
                   [&] {
                     both();
                     if (up < 20 && new_link->try_send(numbered(*topo_, sender, up))) ++up;
                     if (down < 20 && children_->established("a") &&
                         children_->try_send("a", numbered(*topo_, topo_->root().index, down))) {
                       ++down;
                     }
                     return up_.size() >= 20 && down_.size() >= 20;
                   }))
      << "up " << up_.size() << " down " << down_.size();
  EXPECT_EQ(sorted(down_), iota(20));
  EXPECT_TRUE(to_old.empty()) << to_old.size()
                              << " frame(s) of the new session went to the old link";
}

}  // namespace
}  // namespace fedwan::transport
