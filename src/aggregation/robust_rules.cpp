// The library's robust aggregation rules (docs/security.md, "Robust
// aggregation"): buffered, each keeps every child's screened copy of a
// chunk until the chunk closes (fan-in x chunk per chunk in flight) and
// combines the copies in slot order, so the result never depends on the
// order they came in.
//   median        coordinate-wise median of the copies (unweighted; of an
//                 even count, the mean of the two middle values)
//   trimmed_mean  per coordinate, the `trim` smallest and largest values
//                 dropped, the weighted mean of the rest
//   multi_krum    the `select` copies with the lowest Krum scores (the sum
//                 of squared distances to the n - byzantine - 2 nearest
//                 others), their weighted mean; the others are left out
#include "aggregation/robust_rules.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "fedwan/error.hpp"

namespace fedwan::aggregation {
namespace {

struct Copy {
  double weight = 0;
  std::vector<float> values;
};

// Keeps the copies by slot; the rules combine them at finish().
class BufferedCombiner : public ChunkCombiner {
 public:
  explicit BufferedCombiner(uint32_t elements) : elements_(elements) {}
  void add(uint32_t slot, const float* values, double weight) override {
    Copy& c = copies_[slot];
    c.weight = weight;
    c.values.assign(values, values + elements_);
  }
  size_t bytes_held() const override { return copies_.size() * elements_ * sizeof(float); }

 protected:
  double total_weight() const {
    double w = 0;
    for (const auto& entry : copies_) w += entry.second.weight;
    return w;
  }
  uint32_t elements_;
  std::map<uint32_t, Copy> copies_;  // by slot: arrival order never matters
};

class TrimmedCombiner final : public BufferedCombiner {
 public:
  // trim < 0: the median.
  TrimmedCombiner(uint32_t elements, int64_t trim) : BufferedCombiner(elements), trim_(trim) {}

  Combined finish() override {
    const size_t n = copies_.size();
    std::vector<float> out(elements_);
    std::vector<std::pair<float, double>> column(n);
    // Never drop them all: at most (n - 1) / 2 from each end.
    const size_t max_trim = (n - 1) / 2;
    const bool median = trim_ < 0;
    const size_t trim = median ? max_trim : std::min<size_t>(static_cast<size_t>(trim_), max_trim);
    for (uint32_t e = 0; e < elements_; ++e) {
      size_t k = 0;
      for (const auto& entry : copies_) column[k++] = {entry.second.values[e], entry.second.weight};
      std::sort(column.begin(), column.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      if (median) {
        out[e] = n % 2 == 1 ? column[n / 2].first
                            : column[n / 2 - 1].first / 2.0f + column[n / 2].first / 2.0f;
        continue;
      }
      double sum = 0;
      double weight = 0;
      for (size_t i = trim; i < n - trim; ++i) {
        sum += static_cast<double>(column[i].first) * column[i].second;
        weight += column[i].second;
      }
      out[e] = static_cast<float>(sum / weight);
    }
    const double w = total_weight();
    copies_.clear();
    return {std::move(out), w, {}};
  }

 private:
  int64_t trim_;
};

class KrumCombiner final : public BufferedCombiner {
 public:
  KrumCombiner(uint32_t elements, uint32_t byzantine, uint32_t select)
      : BufferedCombiner(elements), byzantine_(byzantine), select_(select) {}

  Combined finish() override {
    std::vector<uint32_t> slots;
    std::vector<const Copy*> copies;
    for (const auto& entry : copies_) {
      slots.push_back(entry.first);
      copies.push_back(&entry.second);
    }
    const size_t n = copies.size();
    const std::vector<double> scores = krum_scores(copies);
    // The `keep` lowest scores, ties by slot.
    const size_t keep =
        std::clamp<size_t>(select_ > 0 ? select_ : n - std::min<size_t>(byzantine_, n - 1), 1, n);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores[a] < scores[b]; });
    std::vector<bool> kept(n, false);
    for (size_t i = 0; i < keep; ++i) kept[order[i]] = true;
    Combined out;
    out.values.assign(elements_, 0.0f);
    const double cutoff = scores[order[keep - 1]];
    for (size_t i = 0; i < n; ++i) {  // slot order: the sum's order is fixed
      if (!kept[i]) {
        out.left_out.push_back({slots[i], "Multi-Krum score " + std::to_string(scores[i]) +
                                              " above the " + std::to_string(keep) +
                                              " lowest (up to " + std::to_string(cutoff) + ")"});
        continue;
      }
      accumulate_weighted(out.values.data(), copies[i]->values.data(), elements_,
                          static_cast<float>(copies[i]->weight));
      out.weight += copies[i]->weight;
    }
    finalize_mean(out.values.data(), elements_, out.weight);
    copies_.clear();
    return out;
  }

 private:
  // Each copy's sum of squared distances to its n - f - 2 nearest others
  // (at least one; 0 for a lone copy).
  std::vector<double> krum_scores(const std::vector<const Copy*>& copies) const {
    const size_t n = copies.size();
    std::vector<std::vector<double>> d(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = i + 1; j < n; ++j) {
        double s = 0;
        for (uint32_t e = 0; e < elements_; ++e) {
          const double diff = static_cast<double>(copies[i]->values[e]) - copies[j]->values[e];
          s += diff * diff;
        }
        d[i][j] = d[j][i] = s;
      }
    }
    const size_t neighbours = n <= byzantine_ + 2 ? std::min<size_t>(1, n - 1) : n - byzantine_ - 2;
    std::vector<double> scores(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> others;
      for (size_t j = 0; j < n; ++j) {
        if (j != i) others.push_back(d[i][j]);
      }
      std::sort(others.begin(), others.end());
      for (size_t k = 0; k < neighbours && k < others.size(); ++k) scores[i] += others[k];
    }
    return scores;
  }

  uint32_t byzantine_;
  uint32_t select_;
};

class TrimmedRule final : public AggregationRule {
 public:
  TrimmedRule(std::string name, int64_t trim) : name_(std::move(name)), trim_(trim) {}
  std::string name() const override { return name_; }
  RuleMemory memory() const override { return RuleMemory::kBuffered; }
  std::unique_ptr<ChunkCombiner> begin_chunk(uint32_t elements, size_t) const override {
    return std::make_unique<TrimmedCombiner>(elements, trim_);
  }

 private:
  std::string name_;
  int64_t trim_;
};

class KrumRule final : public AggregationRule {
 public:
  KrumRule(uint32_t byzantine, uint32_t select) : byzantine_(byzantine), select_(select) {}
  std::string name() const override { return kMultiKrum; }
  RuleMemory memory() const override { return RuleMemory::kBuffered; }
  std::unique_ptr<ChunkCombiner> begin_chunk(uint32_t elements, size_t) const override {
    return std::make_unique<KrumCombiner>(elements, byzantine_, select_);
  }

 private:
  uint32_t byzantine_;
  uint32_t select_;
};

// A whole-number parameter in [lo, hi], or its default.
uint32_t count_param(const std::string& rule, const RuleParams& params, const std::string& key,
                     uint32_t fallback, uint32_t lo, uint32_t hi) {
  auto it = params.find(key);
  if (it == params.end()) return fallback;
  const double v = it->second;
  if (!(v >= lo && v <= hi && v == std::floor(v))) {
    throw ConfigError("aggregation rule '" + rule + "': " + key + " must be a whole number in " +
                      std::to_string(lo) + ".." + std::to_string(hi));
  }
  return static_cast<uint32_t>(v);
}

void only_params(const std::string& rule, const RuleParams& params,
                 const std::vector<std::string>& known) {
  for (const auto& entry : params) {
    if (std::find(known.begin(), known.end(), entry.first) == known.end()) {
      std::string names;
      for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
      throw ConfigError("aggregation rule '" + rule + "' takes no parameter '" + entry.first + "'" +
                        (names.empty() ? "" : "; it takes " + names));
    }
  }
}

}  // namespace

std::shared_ptr<const AggregationRule> make_median_rule(const RuleParams& params) {
  only_params(kMedian, params, {});
  return std::make_shared<const TrimmedRule>(kMedian, -1);
}

std::shared_ptr<const AggregationRule> make_trimmed_mean_rule(const RuleParams& params) {
  only_params(kTrimmedMean, params, {"trim"});
  return std::make_shared<const TrimmedRule>(kTrimmedMean,
                                             count_param(kTrimmedMean, params, "trim", 1, 1, 1000));
}

std::shared_ptr<const AggregationRule> make_multi_krum_rule(const RuleParams& params) {
  only_params(kMultiKrum, params, {"byzantine", "select"});
  return std::make_shared<const KrumRule>(count_param(kMultiKrum, params, "byzantine", 1, 0, 1000),
                                          count_param(kMultiKrum, params, "select", 0, 0, 10000));
}

}  // namespace fedwan::aggregation
