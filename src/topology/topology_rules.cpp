// The rules a topology's values must follow: endpoints, nesting of the
// file, the root's standby keys, tcp_congestion names, socket buffer sizes,
// stream counts and the ranges of the federation settings (see topology.cpp
// for the file format, docs/topology.md for the keys).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/aggregation_rule.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "topology/aggregation_settings.hpp"
#include "topology/topology_internal.hpp"

namespace fedwan::topology_detail {

// HOST may be a name, an address, [IPv6], an interface or *.
bool valid_metrics_address(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size() || a.size() > 255)
    return false;
  const std::string host = a.substr(0, colon);
  const std::string port = a.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
      std::stoul(port) > 65535)
    return false;
  if (host.front() == '[') {
    return host.back() == ']' && host.size() > 2 &&
           std::all_of(host.begin() + 1, host.end() - 1, [](char c) {
             return std::isxdigit(static_cast<unsigned char>(c)) || c == ':';
           });
  }
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
  });
}

bool valid_endpoint(const std::string& e) {
  // Printable ASCII without spaces keeps the canonical rendering unambiguous.
  if (!std::all_of(e.begin(), e.end(), [](char c) { return c > 0x20 && c < 0x7f; })) return false;
  const auto has = [&](const char* scheme) {
    const size_t n = std::strlen(scheme);
    return e.size() > n && e.compare(0, n, scheme) == 0;
  };
  if (has("ipc://") || has("inproc://") || has("mem://")) return true;
  if (!has("tcp://")) return false;
  const std::string addr = e.substr(6);
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) return false;
  const std::string port = addr.substr(colon + 1);
  if (port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535;
}

std::string invalid_endpoint(const std::string& what, const std::string& e) {
  return what + " '" + e +
         "' is invalid; use tcp://HOST:PORT (a port in 1..65535), ipc://PATH, inproc://NAME "
         "or mem://NAME (in-process), no spaces";
}

// Deepest nesting of [ and { outside quoted scalars, and of block
// sequences on one line ("- - - x"), so a hostile file cannot exhaust
// yaml-cpp's recursion before any key is checked.
size_t yaml_nesting(const std::string& text) {
  size_t depth = 0, deepest = 0, dashes = 0;
  char quote = 0;
  bool line_start = true;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '\n') {
      line_start = true;
      dashes = 0;
      continue;
    }
    if (line_start && c == '-' && i + 1 < text.size() && (text[i + 1] == ' ')) {
      deepest = std::max(deepest, ++dashes);
      continue;
    }
    const bool after_space =
        i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n';
    if (c != ' ') line_start = false;
    if (c == '#' && after_space) {
      while (i < text.size() && text[i] != '\n') ++i;
      --i;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// "" when a node of `role` may carry standby key `key`, else why not.
std::string misplaced_standby_key(const std::string& key, Role role) {
  if (role == Role::kRoot) return "";
  return "'" + key + "' applies to the root only; a " + role_name(role) +
         " has no standby of its own (the root's children fail over to the root's standby)";
}

// First problem with node `s`'s standby fields ("" if none). Defaults the
// root's standby_bind to its standby_endpoint, as finalize() does its bind.
std::string standby_problem(NodeSpec& s) {
  if (s.role != Role::kRoot) {
    if (!s.standby_endpoint.empty()) return misplaced_standby_key("standby_endpoint", s.role);
    return s.standby_bind.empty() ? "" : misplaced_standby_key("standby_bind", s.role);
  }
  if (s.standby_endpoint.empty()) {
    if (s.standby_bind.empty()) return "";
    return "standby_bind '" + s.standby_bind +
           "' is given without standby_endpoint; set standby_endpoint (where the root's "
           "children reach the standby) or remove standby_bind";
  }
  if (s.standby_bind.empty()) s.standby_bind = s.standby_endpoint;
  if (!valid_endpoint(s.standby_endpoint)) {
    return invalid_endpoint("standby_endpoint", s.standby_endpoint);
  }
  if (!valid_endpoint(s.standby_bind)) return invalid_endpoint("standby_bind", s.standby_bind);
  if (s.standby_endpoint == s.endpoint) {
    return "standby_endpoint '" + s.standby_endpoint +
           "' is the root's own endpoint; the standby is a second process and needs an "
           "endpoint of its own";
  }
  return "";
}

// "" when `streams` may be a streams value (the federation's or a child's),
// else why not. Whether the root may carry one is check_nodes' business.
std::string streams_problem(uint64_t streams) {
  constexpr uint64_t kMin = 1, kMax = 16;
  if (streams == kStreamsAuto || (streams >= kMin && streams <= kMax)) return "";
  return "streams " + std::to_string(streams) +
         " is out of range: a child opens 1 to 16 TCP connections to its parent, or `auto` "
         "(the default) to use as many as pay";
}

std::string max_streams_problem(uint64_t max) {
  if (max >= 1 && max <= 64) return "";
  return "max_streams " + std::to_string(max) +
         " is out of range: `streams: auto` opens 1 to 64 TCP connections per link";
}

std::string streams_text(uint64_t streams) {
  return streams == kStreamsAuto ? std::string("auto") : std::to_string(streams);
}

std::string socket_buffer_problem(uint64_t bytes) {
  constexpr uint64_t kMin = 64 << 10, kMax = uint64_t{1} << 30;
  if (bytes == 0 || (bytes >= kMin && bytes <= kMax)) return "";
  return "socket_buffer_bytes " + std::to_string(bytes) +
         " is out of range; use 0 (the kernel's autotuning) or 65536 .. 1073741824 (64 KiB .. "
         "1 GiB, about the link's bandwidth-delay product)";
}

// Only the name's form is checked here: which algorithms a host has and
// allows is the host's business, known only where the node runs (the
// transport warns there and keeps the host's default).
std::string tcp_congestion_problem(const std::string& name) {
  const bool well_formed = !name.empty() && name.size() <= kMaxCongestionNameLength &&
                           std::all_of(name.begin(), name.end(), [](char c) {
                             return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
                           });
  if (well_formed) return "";
  return "tcp_congestion '" + name +
         "' is invalid; use a kernel congestion control name of 1..15 characters of "
         "[a-z0-9_] such as bbr, cubic or reno (the host lists its own in "
         "/proc/sys/net/ipv4/tcp_available_congestion_control), or \"" +
         kSystemCongestion + "\" to keep the host's default";
}

void validate_federation(const FederationSpec& f, const std::string& src) {
  auto fail = [&](const std::string& msg) { throw ConfigError(src + ": federation: " + msg); };
  if (f.rounds < 1) fail("rounds is 0; run at least 1 round");
  if (f.inner_steps < 1) fail("inner_steps is 0; take at least 1 local step per round");
  for (const auto& [name, v] : {std::pair<const char*, uint64_t>{"rounds", f.rounds},
                                {"inner_steps", f.inner_steps},
                                {"replica_every", f.replica_every}}) {
    if (v > kMaxCount) {
      fail(std::string(name) + " " + std::to_string(v) + " is more than " +
           std::to_string(kMaxCount));
    }
  }
  if (f.chunk_bytes < kMinChunkBytes || f.chunk_bytes > kMaxChunkBytes || f.chunk_bytes % 4 != 0) {
    fail("chunk_bytes " + std::to_string(f.chunk_bytes) +
         " is invalid; use a multiple of 4 between 4096 and 4194304");
  }
  const auto in = [](double v, double lo, double hi) { return v >= lo && v <= hi; };  // false: NaN
  if (!in(f.round_timeout_s, kMinRoundSeconds, kMaxRoundSeconds)) {
    fail("round_timeout_s " + format_double(f.round_timeout_s) + " must be between " +
         format_double(kMinRoundSeconds) + " and " + format_double(kMaxRoundSeconds) +
         " (30 days)");
  }
  if (!(f.quorum > 0 && f.quorum <= 1)) {
    fail("quorum " + format_double(f.quorum) + " must be a share of the total weight in (0, 1]");
  }
  if (!in(f.deadline_s, 0, f.round_timeout_s)) {
    fail("deadline_s " + format_double(f.deadline_s) +
         " must be between 0 (none) and round_timeout_s " + format_double(f.round_timeout_s));
  }
  if (!in(f.heartbeat_s, kMinHeartbeatSeconds, kMaxHeartbeatSeconds)) {
    fail("heartbeat_s " + format_double(f.heartbeat_s) + " must be between " +
         format_double(kMinHeartbeatSeconds) + " and " + format_double(kMaxHeartbeatSeconds));
  }
  if (!(f.heartbeat_timeout_s > f.heartbeat_s &&
        f.heartbeat_timeout_s <= kMaxHeartbeatTimeoutSeconds)) {
    fail("heartbeat_timeout_s " + format_double(f.heartbeat_timeout_s) +
         " must be longer than heartbeat_s " + format_double(f.heartbeat_s) + " and at most " +
         format_double(kMaxHeartbeatTimeoutSeconds));
  }
  const std::string congestion = tcp_congestion_problem(f.tcp_congestion);
  if (!congestion.empty()) fail(congestion);
  const std::string buffers = socket_buffer_problem(f.socket_buffer_bytes);
  if (!buffers.empty()) fail(buffers);
  const std::string streams = streams_problem(f.streams);
  if (!streams.empty()) fail(streams);
  const std::string max_streams = max_streams_problem(f.max_streams);
  if (!max_streams.empty()) fail(max_streams);
  if (f.overlap_steps > f.inner_steps) {
    fail("overlap_steps " + std::to_string(f.overlap_steps) + " is more than inner_steps " +
         std::to_string(f.inner_steps) +
         "; a site merges the anchor at most one round after it sent its update (0 = blocking)");
  }
  try {
    codec_by_name(f.codec);
  } catch (const ConfigError& e) {
    fail(std::string("codec: ") + e.what());
  }

  const OuterOptimizerSpec& o = f.outer;
  const std::vector<std::string> names = outer_optimizer_names();
  if (std::find(names.begin(), names.end(), o.name) == names.end()) {
    fail("unknown outer_optimizer '" + o.name + "'; use " + join(names));
  }
  if (auto why = outer_optimizer_problem(o)) fail("outer_optimizer '" + o.name + "': " + *why);
  if (auto why = aggregation_spec_problem(f.aggregation)) fail("federation.aggregation: " + *why);
}

std::optional<std::string> aggregation_spec_problem(const AggregationSpec& a) {
  if (!aggregation::has_rule(a.rule)) {
    return "unknown aggregation rule '" + a.rule + "'; use " + join(aggregation::rule_names());
  }
  try {
    aggregation::make_rule(a.rule, a.params);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
  return topology::aggregation_problem(a);
}

}  // namespace fedwan::topology_detail
