// Prometheus metrics: a registry of metric families (counters, gauges,
// histograms, and gauges read from a callback at scrape time) and their
// rendering in the text exposition format 0.0.4.
//
//   MetricsRegistry registry;
//   auto& bytes = registry.counter("fedwan_link_bytes_total", "Bytes moved on a link.",
//                                  {"link", "direction"});
//   Counter& sent = bytes.with({"site-0", "sent"});  // cache it: the reference is stable
//   sent.add(n);
//
// Names follow the Prometheus data model ([a-zA-Z_:][a-zA-Z0-9_:]*; label
// names without ':' and not starting with "__"); fedwan's own carry the
// `fedwan_` prefix, counters end in `_total`, units are base units named in
// the suffix (`_seconds`, `_bytes`).
//
// Thread safety: everything here is thread safe. Registering a family or a
// child takes a lock; updating a child (Counter::add, Gauge::set,
// Histogram::observe) is lock-free. Families and children live as long as
// the registry, so references to them may be cached and used from any
// thread; they never move.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fedwan::metrics {

// A monotonic integer counter (events, bytes).
class Counter {
 public:
  void inc() { add(1); }
  void add(uint64_t n) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A monotonic real counter (seconds spent). A negative or NaN amount is
// dropped: a counter never goes down.
class DoubleCounter {
 public:
  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v);
  void inc() { add(1.0); }
  void dec() { add(-1.0); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets (upper bounds, inclusive, as `le`
// says); the +Inf bucket is implicit.
class Histogram {
 public:
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
  };
  // The counts as exposed: cumulative, and `_count` equal to the +Inf bucket
  // even while other threads observe.
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return *bounds_; }

 private:
  std::shared_ptr<const std::vector<double>> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative
  std::atomic<double> sum_{0.0};
};

// `count` bounds start, start*factor, ... (start > 0, factor > 1).
std::vector<double> exponential_buckets(double start, double factor, size_t count);
// `count` bounds start, start+width, ... (width > 0).
std::vector<double> linear_buckets(double start, double width, size_t count);

enum class MetricKind { kCounter, kDoubleCounter, kGauge, kHistogram, kGaugeFn };

// What a family is; two registrations of one name must agree on all of it.
struct FamilyDef {
  std::string name;
  std::string help;
  MetricKind kind = MetricKind::kCounter;
  std::vector<std::string> label_names;
  std::vector<double> bounds;  // histograms only
};

namespace detail {

// `a="x",b="y"` (no braces), values escaped; empty without labels.
std::string label_text(const std::vector<std::string>& names,
                       const std::vector<std::string>& values);
// Throws ConfigError unless `got` values match the family's label names.
void check_label_count(const FamilyDef& def, size_t got);
// Appends `# HELP` and `# TYPE`.
void render_header(const FamilyDef& def, std::string* out);
// Appends one child's samples; `labels` as label_text() gives it.
void render_child(const FamilyDef& def, const std::string& labels, const Counter& m,
                  std::string* out);
void render_child(const FamilyDef& def, const std::string& labels, const DoubleCounter& m,
                  std::string* out);
void render_child(const FamilyDef& def, const std::string& labels, const Gauge& m,
                  std::string* out);
void render_child(const FamilyDef& def, const std::string& labels, const Histogram& m,
                  std::string* out);

}  // namespace detail

// A named metric and its children, one per combination of label values.
class FamilyBase {
 public:
  explicit FamilyBase(FamilyDef def) : def_(std::move(def)) {}
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const FamilyDef& def() const { return def_; }
  const std::string& name() const { return def_.name; }
  // Appends the family's `# HELP`, `# TYPE` and samples, children sorted by
  // their label values.
  virtual void render(std::string* out) const = 0;

 protected:
  FamilyDef def_;
  mutable std::mutex mutex_;
};

template <class Metric>
class Family : public FamilyBase {
 public:
  using Factory = std::function<std::unique_ptr<Metric>()>;
  Family(FamilyDef def, Factory make) : FamilyBase(std::move(def)), make_(std::move(make)) {}

  // The child with these label values (in the order of the family's label
  // names), made on first use. Throws ConfigError on a wrong count.
  Metric& with(const std::vector<std::string>& label_values) {
    detail::check_label_count(def_, label_values.size());
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = children_[label_values];
    if (!slot) slot = make_();
    return *slot;
  }
  // The child of a family without labels.
  Metric& get() { return with({}); }

  void render(std::string* out) const override {
    detail::render_header(def_, out);
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [values, child] : children_) {
      detail::render_child(def_, detail::label_text(def_.label_names, values), *child, out);
    }
  }

 private:
  Factory make_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;
};

// Unregisters a gauge_fn callback when destroyed. Once the destructor has
// returned, the callback is not running and will not run again.
class GaugeFnHandle {
 public:
  GaugeFnHandle() = default;
  GaugeFnHandle(GaugeFnHandle&& other) noexcept : remove_(std::exchange(other.remove_, nullptr)) {}
  GaugeFnHandle& operator=(GaugeFnHandle&& other) noexcept;
  ~GaugeFnHandle() { reset(); }
  void reset();
  explicit operator bool() const { return static_cast<bool>(remove_); }

 private:
  friend class MetricsRegistry;
  explicit GaugeFnHandle(std::function<void()> remove) : remove_(std::move(remove)) {}
  std::function<void()> remove_;
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Each returns the family with this name, registering it on first use. A
  // name already registered with another kind, help text, label names or
  // buckets, an invalid name, or a name whose samples would clash with
  // another family's (a histogram's `_bucket`, `_sum`, `_count`) throws
  // ConfigError.
  Family<Counter>& counter(const std::string& name, const std::string& help,
                           const std::vector<std::string>& label_names = {});
  Family<DoubleCounter>& double_counter(const std::string& name, const std::string& help,
                                        const std::vector<std::string>& label_names = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help,
                       const std::vector<std::string>& label_names = {});
  // `bounds`: strictly increasing finite upper bounds, at least one (+Inf
  // is added). A histogram may not have a label named "le".
  Family<Histogram>& histogram(const std::string& name, const std::string& help,
                               const std::vector<std::string>& label_names,
                               std::vector<double> bounds);

  // A gauge whose value `fn` returns at each render(), on the rendering
  // thread and outside the registry's locks (so `fn` may itself use the
  // registry). A sample whose `fn` throws is left out of that render. One
  // callback per label values at a time: a second throws ConfigError until
  // the first's handle is reset.
  [[nodiscard]] GaugeFnHandle gauge_fn(const std::string& name, const std::string& help,
                                       const std::vector<std::string>& label_names,
                                       const std::vector<std::string>& label_values,
                                       std::function<double()> fn);

  // The text exposition format 0.0.4: families sorted by name.
  std::string render() const;

 private:
  // The family `def` names, made by `make` on first use; throws as above.
  std::shared_ptr<FamilyBase> add(const FamilyDef& def,
                                  const std::function<std::shared_ptr<FamilyBase>()>& make);

  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<FamilyBase>> families_;
  std::map<std::string, std::string> sample_names_;  // sample name -> its family
};

// Prometheus' rendering of a sample value: "+Inf", "-Inf", "NaN", integers
// without an exponent up to 2^53, the shortest round-trip text otherwise.
std::string format_value(double v);
// Escapes for a label value (backslash, double quote, newline) and for help
// text (backslash, newline).
std::string escape_label_value(const std::string& s);
std::string escape_help(const std::string& s);
// [a-zA-Z_:][a-zA-Z0-9_:]*
bool valid_metric_name(const std::string& name);
// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"
bool valid_label_name(const std::string& name);

}  // namespace fedwan::metrics
