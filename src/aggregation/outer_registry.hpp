// How an outer optimizer declares itself to make_outer_optimizer(): its
// name, the hyper-parameters it takes (default, range, one line of help) and
// a factory over validated values. Each optimizer defines its own, in its
// own .cpp; outer_optimizer.cpp lists them. The topology parser, its digest
// and YAML writer and the Python binding read hyper-parameters by name, so
// adding one touches the optimizer's files and its docs only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fedwan/outer_optimizer.hpp"

namespace fedwan::aggregation {

enum class ParamRange {
  kLearningRate,  // (0, 100], and > 0 as a float
  kPositive,      // finite and > 0, and > 0 as a float
  kUnitInterval,  // [0, 1), and < 1 as a float (a decay rate)
  kRoundCount,    // a whole number of rounds in [0, 1e9]
};

struct OuterParamDef {
  const char* name;
  double default_value;
  ParamRange range;
  const char* help;
};

// Every hyper-parameter of a definition, validated, with defaults filled in.
class OuterParamValues {
 public:
  explicit OuterParamValues(std::map<std::string, double> values) : values_(std::move(values)) {}
  // Throw Error for a name the definition does not declare (a bug, not input).
  float f32(const std::string& name) const;
  uint64_t rounds(const std::string& name) const;

 private:
  double at(const std::string& name) const;
  std::map<std::string, double> values_;
};

struct OuterOptimizerDef {
  const char* name;
  std::vector<OuterParamDef> params;  // in the order the docs list them
  std::unique_ptr<OuterOptimizer> (*make)(const OuterParamValues& values, size_t total_elements);
};

}  // namespace fedwan::aggregation
