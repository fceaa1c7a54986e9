// ChildrenLink's routes (children_link.cpp has the rest): which connection
// of a child a frame goes to. A child's connections carry its link's tag
// (routing_id.hpp); the parent follows the child to the link whose
// handshake made its current session, and sends there only.
#include "transport/links.hpp"

#include <optional>
#include <string>

#include "common/log.hpp"
#include "transport/routing_id.hpp"

namespace fedwan::transport {

std::string ChildrenLink::route(const std::string& child, size_t k) const {
  const auto it = links_.find(child);
  return routing_id(child, k, it == links_.end() ? std::string() : it->second.tag);
}

std::string ChildrenLink::first_connection(const std::string& connection) {
  std::string why;
  const std::optional<RoutingId> id = parse_routing_id(connection, &why);
  return id ? routing_id(id->node, 0, id->link) : connection;
}

void ChildrenLink::follow_link(const std::string& child, const std::string& connection,
                               const ChannelSecurity& security) {
  const uint64_t agreements = security.key_agreements();
  auto [it, fresh] = links_.try_emplace(child);
  if (!fresh && agreements != 0 && agreements == it->second.agreements) return;
  std::string why;
  const std::optional<RoutingId> id = parse_routing_id(connection, &why);
  if (!id) return;  // admitted, so never
  if (!fresh && it->second.tag != id->link && agreements != 0) {
    log().debug("child '{}': a new session on its link {} (was {})", child,
                id->link.empty() ? "(untagged)" : id->link,
                it->second.tag.empty() ? "(untagged)" : it->second.tag);
  }
  it->second.agreements = agreements;
  it->second.tag = id->link;
}

}  // namespace fedwan::transport
