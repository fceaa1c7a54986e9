#include "aggregator/child_claims.hpp"

#include <charconv>
#include <cmath>

#include "node/node_config.hpp"
#include "wire/frame.hpp"

namespace fedwan::aggregator {
namespace {

std::string format_double(double d) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d);
  return std::string(buf, res.ptr);
}

}  // namespace

DeltaWeight judge_delta_weight(bool child_is_site, double subtree_weight, double claimed,
                               double excused) {
  DeltaWeight out;
  if (child_is_site && excused != 0) {
    out.refusal = "a site has no children whose weight it could excuse";
    return out;
  }
  if (excused != 0) {
    // A region whose children's copies were refused: what stands behind its
    // values (none at all, claimed 0) and what was refused together weigh
    // at most its sites.
    out.weight = claimed;
    if (!(std::isfinite(excused) && excused > 0 && std::isfinite(claimed) && claimed >= 0 &&
          claimed + excused <= subtree_weight * (1 + 1e-9))) {
      out.refusal = "delta weight " + format_double(claimed) + " and excused weight " +
                    format_double(excused) + " are more than the weight of the sites under the " +
                    "sender (" + format_double(subtree_weight) + ")";
    }
    return out;
  }
  if (child_is_site) {
    // The topology says what a site weighs; a header cannot change it.
    out.weight = subtree_weight;
    out.claim_differs = claimed != subtree_weight;
    return out;
  }
  // A region's aggregate weighs what its contributing sites weigh: any part
  // of its subtree (a round closed at quorum), never more. A hair of slack
  // covers the same weights summed in another order.
  out.weight = claimed;
  if (!(std::isfinite(claimed) && claimed > 0 && claimed <= subtree_weight * (1 + 1e-9))) {
    out.refusal = "delta weight " + format_double(claimed) +
                  " is more than the weight of the sites under the sender (" +
                  format_double(subtree_weight) + ")";
  }
  return out;
}

std::optional<std::string> telemetry_refusal(uint64_t wan_bytes, uint64_t fp32_bytes,
                                             uint64_t frames) {
  if (wan_bytes > kMaxTelemetryBytes || fp32_bytes > kMaxTelemetryBytes) {
    return "telemetry counts over " + std::to_string(kMaxTelemetryBytes) + " bytes in one round";
  }
  if (frames > wan_bytes / wire::kHeaderSize) {
    return "telemetry counts " + std::to_string(frames) + " frames in " +
           std::to_string(wan_bytes) + " bytes; every frame carries a " +
           std::to_string(wire::kHeaderSize) + "-byte header";
  }
  return std::nullopt;
}

uint64_t replica_max_bytes(uint64_t configured, uint64_t model_elements) {
  if (configured > 0) return configured;
  return model_elements == 0 ? 0 : node::checkpoint_max_bytes(model_elements);
}

}  // namespace fedwan::aggregator
