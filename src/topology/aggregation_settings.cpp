#include "topology/aggregation_settings.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace fedwan::topology {
namespace {

constexpr uint64_t kMaxWindow = 64;
constexpr uint64_t kMaxReplayWindow = 1024;

std::string number(double d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", d);
  return buf;
}

bool positive_finite(double d) { return std::isfinite(d) && d > 0; }

}  // namespace

std::optional<std::string> aggregation_problem(const AggregationSpec& a) {
  if (!std::isfinite(a.max_abs) || a.max_abs < 0) {
    return "max_abs " + number(a.max_abs) + " must be finite and >= 0 (0: no bound)";
  }
  if (a.replay_window > kMaxReplayWindow) {
    return "replay_window " + std::to_string(a.replay_window) + " must be 0.." +
           std::to_string(kMaxReplayWindow) + " rounds (0: no replay check)";
  }
  const NormBoundSpec& b = a.norm_bound;
  if (b.mode != "adaptive" && b.mode != "absolute" && b.mode != "off") {
    return "norm_bound.mode '" + b.mode + "': use adaptive, absolute or off";
  }
  if (b.action != "refuse" && b.action != "clip") {
    return "norm_bound.action '" + b.action + "': use refuse or clip";
  }
  if (b.mode == "adaptive" && !(std::isfinite(b.factor) && b.factor > 1)) {
    return "norm_bound.factor " + number(b.factor) + " must be finite and > 1";
  }
  if (b.mode == "adaptive" && (b.window < 1 || b.window > kMaxWindow)) {
    return "norm_bound.window " + std::to_string(b.window) + " must be 1.." +
           std::to_string(kMaxWindow) + " rounds";
  }
  if (b.mode == "absolute" && !positive_finite(b.bound)) {
    return "norm_bound.bound " + number(b.bound) + " must be finite and > 0 in absolute mode";
  }
  return std::nullopt;
}

}  // namespace fedwan::topology
