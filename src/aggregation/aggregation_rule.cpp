#include "aggregation/aggregation_rule.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "aggregation/robust_rules.hpp"
#include "aggregation/round_accumulator.hpp"
#include "fedwan/error.hpp"

namespace fedwan::aggregation {
namespace {

class WeightedMeanCombiner final : public ChunkCombiner {
 public:
  explicit WeightedMeanCombiner(uint32_t elements) : sum_(elements, 0.0f) {}
  // In a buffer used before: its values stand for zeros until the first
  // add() writes every one of them.
  WeightedMeanCombiner(uint32_t elements, std::vector<float>&& buffer)
      : sum_(std::move(buffer)), unwritten_(true) {
    sum_.resize(elements);
  }
  void add(uint32_t, const float* values, double weight) override {
    if (unwritten_) {
      first_weighted(sum_.data(), values, sum_.size(), static_cast<float>(weight));
      unwritten_ = false;
    } else {
      accumulate_weighted(sum_.data(), values, sum_.size(), static_cast<float>(weight));
    }
    weight_ += weight;
  }
  void add_encoded(uint32_t, const Codec& codec, const uint8_t* payload, uint32_t elements,
                   double weight, std::vector<float>&) override {
    if (unwritten_) {
      // Decoded where the sum goes, then 0 + weight * x in place.
      codec.decode(payload, elements, sum_.data());
      first_weighted(sum_.data(), sum_.data(), sum_.size(), static_cast<float>(weight));
      unwritten_ = false;
    } else {
      codec.decode_accumulate(payload, elements, static_cast<float>(weight), sum_.data());
    }
    weight_ += weight;
  }
  Combined finish() override {
    if (unwritten_) std::fill(sum_.begin(), sum_.end(), 0.0f);  // nothing added: no values
    finalize_mean(sum_.data(), sum_.size(), weight_);
    return {std::move(sum_), weight_, {}};
  }
  size_t bytes_held() const override { return sum_.size() * sizeof(float); }
  // Set aside and refilled as it is, unwritten or not: the flag stays here.
  std::vector<float>* parkable() override { return &sum_; }

 private:
  std::vector<float> sum_;
  bool unwritten_ = false;
  double weight_ = 0;
};

class WeightedMeanRule final : public AggregationRule {
 public:
  std::string name() const override { return kWeightedMean; }
  RuleMemory memory() const override { return RuleMemory::kStreaming; }
  std::unique_ptr<ChunkCombiner> begin_chunk(uint32_t elements, size_t) const override {
    return std::make_unique<WeightedMeanCombiner>(elements);
  }
  std::unique_ptr<ChunkCombiner> begin_chunk_reusing(uint32_t elements, size_t,
                                                     std::vector<float>&& buffer) const override {
    return std::make_unique<WeightedMeanCombiner>(elements, std::move(buffer));
  }
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, RuleFactory> factories;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: rules may be made during exit
    reg->factories[kWeightedMean] = [](const RuleParams& params) {
      if (!params.empty()) {
        throw ConfigError("aggregation rule 'weighted_mean' takes no parameter '" +
                          params.begin()->first + "'");
      }
      static const auto rule = std::make_shared<const WeightedMeanRule>();
      return rule;
    };
    reg->factories[kMedian] = make_median_rule;
    reg->factories[kTrimmedMean] = make_trimmed_mean_rule;
    reg->factories[kMultiKrum] = make_multi_krum_rule;
    return reg;
  }();
  return *r;
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string joined_names(const std::map<std::string, RuleFactory>& factories) {
  std::string out;
  for (const auto& entry : factories) out += (out.empty() ? "" : ", ") + entry.first;
  return out;
}

}  // namespace

void ChunkCombiner::add_encoded(uint32_t slot, const Codec& codec, const uint8_t* payload,
                                uint32_t elements, double weight, std::vector<float>& scratch) {
  if (scratch.size() < elements) scratch.resize(elements);
  codec.decode(payload, elements, scratch.data());
  add(slot, scratch.data(), weight);
}

const char* rule_memory_name(RuleMemory m) {
  return m == RuleMemory::kStreaming ? "streaming" : "buffered";
}

void register_rule(const std::string& name, RuleFactory factory) {
  if (!valid_name(name)) {
    throw ConfigError("aggregation rule name '" + name + "': use 1..64 of [a-z0-9_]");
  }
  if (!factory) throw ConfigError("aggregation rule '" + name + "' has no factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(name, std::move(factory)).second) {
    throw ConfigError("aggregation rule '" + name + "' is registered already");
  }
}

bool has_rule(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.factories.count(name) != 0;
}

std::shared_ptr<const AggregationRule> make_rule(const std::string& name,
                                                 const RuleParams& params) {
  RuleFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      throw ConfigError("unknown aggregation rule '" + name + "'; use " +
                        joined_names(r.factories));
    }
    factory = it->second;
  }
  auto rule = factory(params);
  if (!rule) throw ConfigError("aggregation rule '" + name + "': its factory made nothing");
  return rule;
}

std::vector<std::string> rule_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& entry : r.factories) out.push_back(entry.first);
  return out;
}

}  // namespace fedwan::aggregation
