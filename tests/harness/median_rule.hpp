// A second aggregation rule for tests: the coordinate-wise median of the
// children's copies (unweighted; with an even count, the mean of the two
// middle values). Buffered: it keeps every copy of a chunk until the chunk
// closes. It lives here, not in the library, to show that a rule plugs in
// through aggregation/ alone: the roles never name it.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/aggregation_rule.hpp"

namespace fedwan::testing {

inline constexpr const char* kTestMedian = "test_median";

class MedianCombiner final : public aggregation::ChunkCombiner {
 public:
  explicit MedianCombiner(uint32_t elements) : elements_(elements) {}
  void add(uint32_t slot, const float* values, double weight) override {
    copies_[slot].assign(values, values + elements_);  // by slot: arrival order never matters
    weight_ += weight;
  }
  aggregation::Combined finish() override {
    std::vector<float> out(elements_);
    std::vector<float> column(copies_.size());
    for (uint32_t e = 0; e < elements_; ++e) {
      size_t k = 0;
      for (const auto& entry : copies_) column[k++] = entry.second[e];
      std::sort(column.begin(), column.end());
      const size_t n = column.size();
      out[e] = n % 2 == 1 ? column[n / 2] : (column[n / 2 - 1] + column[n / 2]) / 2.0f;
    }
    copies_.clear();
    return {std::move(out), weight_, {}};
  }
  size_t bytes_held() const override { return copies_.size() * elements_ * sizeof(float); }

 private:
  uint32_t elements_;
  double weight_ = 0;
  std::map<uint32_t, std::vector<float>> copies_;
};

class MedianRule final : public aggregation::AggregationRule {
 public:
  std::string name() const override { return kTestMedian; }
  aggregation::RuleMemory memory() const override { return aggregation::RuleMemory::kBuffered; }
  std::unique_ptr<aggregation::ChunkCombiner> begin_chunk(uint32_t elements,
                                                          size_t) const override {
    return std::make_unique<MedianCombiner>(elements);
  }
};

// Registers the rule once per process (topologies may name it after this).
inline void register_test_median_rule() {
  static const bool registered = [] {
    aggregation::register_rule(kTestMedian, [](const aggregation::RuleParams&) {
      return std::make_shared<const MedianRule>();
    });
    return true;
  }();
  (void)registered;
}

}  // namespace fedwan::testing
