#include "transport/routing_id.hpp"

#include <openssl/rand.h>

#include <array>

#include "common/openssl_check.hpp"

namespace fedwan::transport {
namespace {

bool is_lower_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// 1-2 decimal digits without a leading zero, or "0" where zero is allowed.
std::optional<size_t> stripe_number(std::string_view k, bool zero_allowed) {
  if (k.empty() || k.size() > 2 || k.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  if (k[0] == '0' && !(zero_allowed && k.size() == 1)) return std::nullopt;
  size_t n = 0;
  for (char c : k) n = n * 10 + static_cast<size_t>(c - '0');
  return n;
}

}  // namespace

std::optional<RoutingId> parse_routing_id(std::string_view id, std::string* why) {
  const size_t tilde = id.find('~');
  if (tilde == std::string_view::npos) return RoutingId{std::string(id), 0, ""};
  RoutingId out;
  out.node = std::string(id.substr(0, tilde));
  std::string_view rest = id.substr(tilde + 1);
  const size_t dot = rest.find('.');
  std::optional<size_t> k;
  if (dot == std::string_view::npos) {
    k = stripe_number(rest, /*zero_allowed=*/false);
  } else {
    const std::string_view tag = rest.substr(dot + 1);
    k = stripe_number(rest.substr(0, dot), /*zero_allowed=*/true);
    if (k && tag.size() == kLinkTagLength && is_lower_hex(tag)) {
      out.link = std::string(tag);
    } else {
      k.reset();
    }
  }
  if (!k || out.node.empty()) {
    *why = "malformed routing id (a connection is <id>~<k>.<link>, k below 100 and <link> 16 hex "
           "digits, or <id>, or <id>~<k> with k >= 1)";
    return std::nullopt;
  }
  out.stripe = *k;
  return out;
}

std::string routing_id(std::string_view node, size_t stripe, std::string_view link) {
  std::string id(node);
  if (link.empty()) {
    if (stripe > 0) id += "~" + std::to_string(stripe);
    return id;
  }
  id += "~" + std::to_string(stripe) + ".";
  id += link;
  return id;
}

std::string untagged_routing_id(std::string_view id) {
  std::string why;
  const std::optional<RoutingId> parsed = parse_routing_id(id, &why);
  return parsed ? routing_id(parsed->node, parsed->stripe, "") : std::string(id);
}

std::string new_link_tag() {
  std::array<unsigned char, kLinkTagLength / 2> bytes{};
  detail::openssl_check(RAND_bytes(bytes.data(), static_cast<int>(bytes.size())), "RAND_bytes");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string tag;
  tag.reserve(kLinkTagLength);
  for (unsigned char b : bytes) {
    tag += kHex[b >> 4];
    tag += kHex[b & 0xf];
  }
  return tag;
}

}  // namespace fedwan::transport
