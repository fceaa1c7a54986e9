#include "fedwan/outer_optimizer.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "aggregation/diloco.hpp"
#include "aggregation/fedadam.hpp"
#include "aggregation/fedavg.hpp"
#include "aggregation/outer_registry.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

// In the order error messages and outer_optimizer_names() list them.
const aggregation::OuterOptimizerDef* const kRegistry[] = {
    &aggregation::FedAvgOptimizer::definition(),
    &aggregation::DiLoCoOptimizer::definition(),
    &aggregation::FedAdamOptimizer::definition(),
};

constexpr double kMaxLearningRate = 100;
constexpr double kMaxRounds = 1e9;

std::string format_number(double v) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

const aggregation::OuterOptimizerDef* find(const std::string& name) {
  for (const aggregation::OuterOptimizerDef* def : kRegistry) {
    if (name == def->name) return def;
  }
  return nullptr;
}

std::string range_text(aggregation::ParamRange range) {
  switch (range) {
    case aggregation::ParamRange::kLearningRate:
      return "(0, " + format_number(kMaxLearningRate) + "]";
    case aggregation::ParamRange::kPositive: return "finite and > 0";
    case aggregation::ParamRange::kUnitInterval: return "[0, 1)";
    case aggregation::ParamRange::kRoundCount:
      return "a whole number in [0, " + format_number(kMaxRounds) + "]";
  }
  return "?";
}

// Checks run on the float the update will use, not just on the double the
// user wrote: 1e-50 is a positive double but 0 as a float, and 1 - 1e-9 is
// below 1 as a double but exactly 1 as a float. Narrowing happens only inside
// float's range, where it is defined.
bool in_range(aggregation::ParamRange range, double v) {
  switch (range) {
    case aggregation::ParamRange::kLearningRate:
      return v > 0 && v <= kMaxLearningRate && static_cast<float>(v) > 0;
    case aggregation::ParamRange::kPositive:
      return v > 0 && v <= std::numeric_limits<float>::max() && static_cast<float>(v) > 0;
    case aggregation::ParamRange::kUnitInterval:
      return v >= 0 && v < 1 && static_cast<float>(v) < 1;
    case aggregation::ParamRange::kRoundCount:
      return v >= 0 && v <= kMaxRounds && std::floor(v) == v;
  }
  return false;
}

std::string range_phrase(aggregation::ParamRange range) {
  const std::string text = range_text(range);
  const bool interval = text.front() == '(' || text.front() == '[';
  return (interval ? "must be in " : "must be ") + text +
         (range == aggregation::ParamRange::kRoundCount ? "" : " (as a 32-bit float)");
}

std::vector<std::string> param_names(const aggregation::OuterOptimizerDef& def) {
  std::vector<std::string> names;
  for (const auto& p : def.params) names.emplace_back(p.name);
  return names;
}

std::optional<std::string> problem_with(const aggregation::OuterOptimizerDef& def,
                                        const OuterOptimizerSpec& spec) {
  for (const auto& [key, value] : spec.params) {
    const aggregation::OuterParamDef* p = nullptr;
    for (const auto& candidate : def.params) {
      if (key == candidate.name) p = &candidate;
    }
    if (!p) return "does not use '" + key + "'; it takes " + join(param_names(def));
    if (!in_range(p->range, value)) {
      return key + " " + format_number(value) + " " + range_phrase(p->range);
    }
  }
  return std::nullopt;
}

}  // namespace

double aggregation::OuterParamValues::at(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    FEDWAN_THROW(Error, "outer optimizer reads '" + name + "', which its definition lacks");
  }
  return it->second;
}

float aggregation::OuterParamValues::f32(const std::string& name) const {
  return static_cast<float>(at(name));
}

uint64_t aggregation::OuterParamValues::rounds(const std::string& name) const {
  return static_cast<uint64_t>(at(name));
}

std::optional<std::string> outer_optimizer_problem(const OuterOptimizerSpec& spec) {
  const aggregation::OuterOptimizerDef* def = find(spec.name);
  if (!def) return "unknown optimizer; known: " + join(outer_optimizer_names());
  return problem_with(*def, spec);
}

std::unique_ptr<OuterOptimizer> make_outer_optimizer(const OuterOptimizerSpec& spec,
                                                     size_t total_elements) {
  const aggregation::OuterOptimizerDef* def = find(spec.name);
  if (!def) {
    throw ConfigError("unknown outer optimizer '" + spec.name +
                      "'; known: " + join(outer_optimizer_names()));
  }
  if (auto why = problem_with(*def, spec)) {
    throw ConfigError("outer optimizer '" + spec.name + "': " + *why);
  }
  std::map<std::string, double> values;
  for (const auto& p : def->params) values[p.name] = spec.param(p.name).value_or(p.default_value);
  return def->make(aggregation::OuterParamValues(std::move(values)), total_elements);
}

std::vector<std::string> outer_optimizer_names() {
  std::vector<std::string> names;
  for (const aggregation::OuterOptimizerDef* def : kRegistry) names.emplace_back(def->name);
  return names;
}

std::vector<OuterOptimizerParam> outer_optimizer_params(const std::string& optimizer) {
  const aggregation::OuterOptimizerDef* def = find(optimizer);
  if (!def) {
    throw ConfigError("unknown outer optimizer '" + optimizer +
                      "'; known: " + join(outer_optimizer_names()));
  }
  std::vector<OuterOptimizerParam> out;
  for (const auto& p : def->params) {
    out.push_back({p.name, p.default_value, range_text(p.range), p.help});
  }
  return out;
}

}  // namespace fedwan
