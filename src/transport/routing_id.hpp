// The routing ids a child's connections carry to its parent.
//
// A child's link (transport::ParentLink) opens one or more connections, all
// under routing ids of one form: "<node id>~<k>.<link>", k the connection's
// place (0 the first, which carries the handshake) and <link> a tag drawn
// at random for each link the child opens. A parent routes a child's
// frames to the connections of the link whose handshake made its current
// session (ChildrenLink), so that a connection of a link the child already
// replaced, which ZeroMQ may still complete after the new one's (it closes
// sockets in the background), can never take a live connection's id
// over: its tag is another. The tag is no secret (it travels in the clear
// in ZeroMQ's handshake); it only tells one link of a node from the next.
//
// The older forms "<node id>" (the first connection) and "<node id>~<k>"
// (k >= 1) carry no tag; a parent still takes them, and routes to them as
// before.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fedwan::transport {

struct RoutingId {
  std::string node;   // the child's node id (not checked here)
  size_t stripe = 0;  // which of its connections: 0 the first
  std::string link;   // the link's tag; empty in the untagged forms
};

// Connections per link this form can name: k below 100.
inline constexpr size_t kMaxStripes = 100;
// A link's tag: 16 lowercase hex digits (64 random bits).
inline constexpr size_t kLinkTagLength = 16;

// Splits a routing id a parent received; nullopt (with *why) for one that
// names a connection but not in a form above.
std::optional<RoutingId> parse_routing_id(std::string_view id, std::string* why);

// "<node>~<stripe>.<link>", or the untagged form when `link` is empty.
std::string routing_id(std::string_view node, size_t stripe, std::string_view link);

// `id` without its link's tag ("a~0.<link>" is "a", "a~1.<link>" is
// "a~1"): one connection of a node's, whichever link it is of (logs,
// tests). An id that does not parse is returned as it is.
std::string untagged_routing_id(std::string_view id);

// A fresh link's tag, from the cryptographic random generator.
std::string new_link_tag();

}  // namespace fedwan::transport
