#include "fedwan/outer_optimizer.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "aggregation/diloco.hpp"
#include "aggregation/fedadam.hpp"
#include "aggregation/fedavg.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

enum ParamBit : unsigned {
  kLr = 1u << 0,
  kMomentum = 1u << 1,
  kBeta1 = 1u << 2,
  kBeta2 = 1u << 3,
  kEps = 1u << 4,
};

struct ParamInfo {
  ParamBit bit;
  const char* name;
  std::optional<double> OuterOptimizerSpec::*field;
};

constexpr ParamInfo kParams[] = {
    {kLr, "lr", &OuterOptimizerSpec::lr},
    {kMomentum, "momentum", &OuterOptimizerSpec::momentum},
    {kBeta1, "beta1", &OuterOptimizerSpec::beta1},
    {kBeta2, "beta2", &OuterOptimizerSpec::beta2},
    {kEps, "eps", &OuterOptimizerSpec::eps},
};

std::string format_number(double v) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

[[noreturn]] void throw_bad_value(const OuterOptimizerSpec& spec, const char* param,
                                  const char* requirement, double v) {
  throw ConfigError("outer optimizer '" + spec.name + "': " + param + " must be " + requirement +
                    ", got " + format_number(v));
}

// Checks run on the float the update will use, not just on the double the
// user wrote: 1e-50 is a positive double but 0 as a float, and 1 - 1e-9 is
// below 1 as a double but exactly 1 as a float. Narrowing happens only inside
// float's range, where it is defined.
float positive_finite(const OuterOptimizerSpec& spec, const char* param, double v) {
  if (v > 0 && v <= std::numeric_limits<float>::max()) {
    const float f = static_cast<float>(v);
    if (f > 0) return f;
  }
  throw_bad_value(spec, param, "finite and > 0 (as a 32-bit float)", v);
}

float unit_interval(const OuterOptimizerSpec& spec, const char* param, double v) {
  if (v >= 0 && v < 1) {
    const float f = static_cast<float>(v);
    if (f < 1) return f;
  }
  throw_bad_value(spec, param, "in [0, 1) (as a 32-bit float)", v);
}

std::unique_ptr<OuterOptimizer> make_fedavg(const OuterOptimizerSpec& spec, size_t total) {
  FedAvgOptimizer::Options o;
  if (spec.lr) o.lr = positive_finite(spec, "lr", *spec.lr);
  return std::make_unique<FedAvgOptimizer>(o, total);
}

std::unique_ptr<OuterOptimizer> make_diloco(const OuterOptimizerSpec& spec, size_t total) {
  DiLoCoOptimizer::Options o;
  if (spec.lr) o.lr = positive_finite(spec, "lr", *spec.lr);
  if (spec.momentum) o.momentum = unit_interval(spec, "momentum", *spec.momentum);
  return std::make_unique<DiLoCoOptimizer>(o, total);
}

std::unique_ptr<OuterOptimizer> make_fedadam(const OuterOptimizerSpec& spec, size_t total) {
  FedAdamOptimizer::Options o;
  if (spec.lr) o.lr = positive_finite(spec, "lr", *spec.lr);
  if (spec.beta1) o.beta1 = unit_interval(spec, "beta1", *spec.beta1);
  if (spec.beta2) o.beta2 = unit_interval(spec, "beta2", *spec.beta2);
  if (spec.eps) o.eps = positive_finite(spec, "eps", *spec.eps);
  return std::make_unique<FedAdamOptimizer>(o, total);
}

struct Entry {
  const char* name;
  unsigned params;  // hyper-parameters it takes; setting any other is refused as a likely typo
  std::unique_ptr<OuterOptimizer> (*make)(const OuterOptimizerSpec&, size_t);
};

// In the order error messages and outer_optimizer_names() list them.
constexpr Entry kRegistry[] = {
    {"fedavg", kLr, &make_fedavg},
    {"diloco", kLr | kMomentum, &make_diloco},
    {"fedadam", kLr | kBeta1 | kBeta2 | kEps, &make_fedadam},
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string param_names(unsigned params) {
  std::vector<std::string> names;
  for (const auto& p : kParams) {
    if (params & p.bit) names.emplace_back(p.name);
  }
  return join(names);
}

}  // namespace

std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptimizerSpec& spec,
                                                     size_t total_elements) {
  for (const auto& entry : kRegistry) {
    if (spec.name != entry.name) continue;
    for (const auto& p : kParams) {
      if ((spec.*p.field).has_value() && !(entry.params & p.bit)) {
        throw ConfigError("outer optimizer '" + spec.name + "' does not use " + p.name +
                          "; remove it (" + spec.name + " takes: " + param_names(entry.params) +
                          ")");
      }
    }
    return entry.make(spec, total_elements);
  }
  throw ConfigError("unknown outer optimizer '" + spec.name +
                    "'; known: " + join(outer_optimizer_names()));
}

std::vector<std::string> outer_optimizer_names() {
  std::vector<std::string> names;
  for (const auto& entry : kRegistry) names.emplace_back(entry.name);
  return names;
}

}  // namespace fedwan
