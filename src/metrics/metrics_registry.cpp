#include "metrics/metrics_registry.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "fedwan/error.hpp"

namespace fedwan::metrics {

namespace {

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

// fetch_add for an atomic<double> (C++17 has none).
void atomic_add(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

// Per MetricKind, in its order: the exposition type, and the registering
// call (for error messages).
struct KindNames {
  const char* type;
  const char* call;
};
constexpr KindNames kKinds[] = {{"counter", "counter"},
                                {"counter", "double_counter"},
                                {"gauge", "gauge"},
                                {"histogram", "histogram"},
                                {"gauge", "gauge_fn"}};
const KindNames& names_of(MetricKind kind) { return kKinds[static_cast<int>(kind)]; }

// Prometheus' escapes: backslash and newline, and in a label value the
// double quote.
std::string escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\' || (quote && c == '"')) out += '\\';
    if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// A family of plain children, made without arguments.
template <class Metric>
std::shared_ptr<FamilyBase> plain_family(const FamilyDef& def) {
  return std::make_shared<Family<Metric>>(def, [] { return std::make_unique<Metric>(); });
}

std::string join(const std::vector<std::string>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s + "}";
}

std::string join(const std::vector<double>& v) {
  std::vector<std::string> s;
  s.reserve(v.size());
  for (double d : v) s.push_back(format_value(d));
  return join(s);
}

// The sample names a family exposes.
std::vector<std::string> sample_names(const FamilyDef& def) {
  if (def.kind == MetricKind::kHistogram) {
    return {def.name + "_bucket", def.name + "_sum", def.name + "_count"};
  }
  return {def.name};
}

void append_sample(const std::string& name, const std::string& labels, const std::string& value,
                   std::string* out) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += ' ';
  *out += value;
  *out += '\n';
}

// The children of a gauge_fn family: callbacks, evaluated outside every
// registry lock. A callback's own mutex makes GaugeFnHandle::reset() wait
// for a call in progress.
class GaugeFnFamily : public FamilyBase {
 public:
  struct Callback {
    std::mutex mutex;
    std::function<double()> fn;
  };

  using FamilyBase::FamilyBase;

  std::shared_ptr<Callback> add(const std::vector<std::string>& values,
                                std::function<double()> fn) {
    detail::check_label_count(def_, values.size());
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = children_[values];
    if (slot) {
      throw ConfigError("metric " + def_.name + join(values) +
                        " already has a callback: reset its GaugeFnHandle first");
    }
    slot = std::make_shared<Callback>();
    slot->fn = std::move(fn);
    return slot;
  }

  void erase(const std::vector<std::string>& values, const std::shared_ptr<Callback>& cb) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = children_.find(values);
    if (it != children_.end() && it->second == cb) children_.erase(it);
  }

  void render(std::string* out) const override {
    std::vector<std::pair<std::string, std::shared_ptr<Callback>>> children;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [values, cb] : children_) {
        children.emplace_back(detail::label_text(def_.label_names, values), cb);
      }
    }
    detail::render_header(def_, out);
    for (const auto& [labels, cb] : children) {
      std::lock_guard<std::mutex> lock(cb->mutex);
      if (!cb->fn) continue;
      double v;
      try {
        v = cb->fn();
      } catch (...) {
        continue;  // no value this time; the scrape goes on
      }
      append_sample(def_.name, labels, format_value(v), out);
    }
  }

 private:
  std::map<std::vector<std::string>, std::shared_ptr<Callback>> children_;
};

}  // namespace

void DoubleCounter::add(double v) {
  if (v > 0) atomic_add(value_, v);  // false for negatives and NaN
}

void Gauge::add(double v) { atomic_add(value_, v); }

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    // () value-initialises: every count starts at zero.
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_->size() + 1]()) {}

void Histogram::observe(double v) {
  // The first bucket whose bound is >= v; NaN belongs to none but +Inf.
  size_t i = std::isnan(v)
                 ? bounds_->size()
                 : static_cast<size_t>(std::lower_bound(bounds_->begin(), bounds_->end(), v) -
                                       bounds_->begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  atomic_add(sum_, v);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> exponential_buckets(double start, double factor, size_t count) {
  if (!(start > 0) || !(factor > 1) || count == 0) {
    throw ConfigError("exponential_buckets: need start > 0, factor > 1 and count >= 1");
  }
  std::vector<double> b;
  b.reserve(count);
  double v = start;
  for (size_t i = 0; i < count; ++i) {
    b.push_back(v);
    v *= factor;
  }
  return b;
}

std::vector<double> linear_buckets(double start, double width, size_t count) {
  if (!(width > 0) || !std::isfinite(start) || count == 0) {
    throw ConfigError("linear_buckets: need a finite start, width > 0 and count >= 1");
  }
  std::vector<double> b;
  for (size_t i = 0; i < count; ++i) b.push_back(start + width * static_cast<double>(i));
  return b;
}

GaugeFnHandle& GaugeFnHandle::operator=(GaugeFnHandle&& other) noexcept {
  if (this != &other) {
    reset();
    remove_ = std::exchange(other.remove_, nullptr);
  }
  return *this;
}

void GaugeFnHandle::reset() {
  if (remove_) std::exchange(remove_, nullptr)();
}

namespace detail {

std::string label_text(const std::vector<std::string>& names,
                       const std::vector<std::string>& values) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (i) s += ',';
    s += names[i] + "=\"" + escape_label_value(values[i]) + '"';
  }
  return s;
}

void check_label_count(const FamilyDef& def, size_t got) {
  if (got != def.label_names.size()) {
    throw ConfigError("metric " + def.name + " has labels " + join(def.label_names) + ", got " +
                      std::to_string(got) + " label value(s)");
  }
}

void render_header(const FamilyDef& def, std::string* out) {
  *out += "# HELP " + def.name + ' ' + escape_help(def.help) + '\n';
  *out += "# TYPE " + def.name + ' ' + names_of(def.kind).type + '\n';
}

void render_child(const FamilyDef& d, const std::string& l, const Counter& m, std::string* out) {
  append_sample(d.name, l, std::to_string(m.value()), out);
}

void render_child(const FamilyDef& d, const std::string& l, const DoubleCounter& m,
                  std::string* out) {
  append_sample(d.name, l, format_value(m.value()), out);
}

void render_child(const FamilyDef& d, const std::string& l, const Gauge& m, std::string* out) {
  append_sample(d.name, l, format_value(m.value()), out);
}

void render_child(const FamilyDef& def, const std::string& labels, const Histogram& m,
                  std::string* out) {
  const Histogram::Snapshot s = m.snapshot();
  const std::string prefix = labels.empty() ? "" : labels + ",";
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    const std::string le = i < m.bounds().size() ? format_value(m.bounds()[i]) : "+Inf";
    std::string bucket_labels = prefix;
    bucket_labels += "le=\"";
    bucket_labels += le;
    bucket_labels += '"';
    append_sample(def.name + "_bucket", bucket_labels, std::to_string(s.cumulative[i]), out);
  }
  append_sample(def.name + "_sum", labels, format_value(s.sum), out);
  append_sample(def.name + "_count", labels, std::to_string(s.cumulative.back()), out);
}

}  // namespace detail

std::shared_ptr<FamilyBase> MetricsRegistry::add(
    const FamilyDef& def, const std::function<std::shared_ptr<FamilyBase>()>& make) {
  if (!valid_metric_name(def.name)) {
    throw ConfigError(
        "metric name \"" + def.name +
        "\" is not valid: use [a-zA-Z_:][a-zA-Z0-9_:]*, e.g. fedwan_link_bytes_total");
  }
  std::set<std::string> seen;
  for (const auto& label : def.label_names) {
    if (!valid_label_name(label)) {
      throw ConfigError("metric " + def.name + ": label name \"" + label +
                        "\" is not valid: use [a-zA-Z_][a-zA-Z0-9_]* not starting with __");
    }
    if (!seen.insert(label).second) {
      throw ConfigError("metric " + def.name + ": label \"" + label + "\" given twice");
    }
    if (def.kind == MetricKind::kHistogram && label == "le") {
      throw ConfigError("histogram " + def.name + ": \"le\" is reserved for the buckets");
    }
  }

  std::lock_guard<std::mutex> lock(mutex_);
  auto it = families_.find(def.name);
  if (it != families_.end()) {
    const FamilyDef& old = it->second->def();
    std::string what;
    if (old.kind != def.kind) {
      what = std::string("a ") + names_of(old.kind).call + ", not a " + names_of(def.kind).call;
    } else if (old.label_names != def.label_names) {
      what = "labels " + join(old.label_names) + ", not " + join(def.label_names);
    } else if (old.help != def.help) {
      what = "help \"" + old.help + "\", not \"" + def.help + "\"";
    } else if (old.bounds != def.bounds) {
      what = "buckets " + join(old.bounds) + ", not " + join(def.bounds);
    }
    if (!what.empty()) {
      throw ConfigError("metric " + def.name + " is already registered with " + what +
                        ": register each metric once, with one definition");
    }
    return it->second;
  }
  for (const auto& sample : sample_names(def)) {
    auto clash = sample_names_.find(sample);
    if (clash != sample_names_.end()) {
      throw ConfigError("metric " + def.name + " would expose " + sample + ", which metric " +
                        clash->second + " exposes already: rename one");
    }
  }
  auto family = make();
  for (const auto& sample : sample_names(def)) sample_names_[sample] = def.name;
  families_[def.name] = family;
  return family;
}

Family<Counter>& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                          const std::vector<std::string>& label_names) {
  FamilyDef def{name, help, MetricKind::kCounter, label_names, {}};
  return static_cast<Family<Counter>&>(*add(def, [&] { return plain_family<Counter>(def); }));
}

Family<DoubleCounter>& MetricsRegistry::double_counter(
    const std::string& name, const std::string& help, const std::vector<std::string>& label_names) {
  FamilyDef def{name, help, MetricKind::kDoubleCounter, label_names, {}};
  return static_cast<Family<DoubleCounter>&>(
      *add(def, [&] { return plain_family<DoubleCounter>(def); }));
}

Family<Gauge>& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                                      const std::vector<std::string>& label_names) {
  FamilyDef def{name, help, MetricKind::kGauge, label_names, {}};
  return static_cast<Family<Gauge>&>(*add(def, [&] { return plain_family<Gauge>(def); }));
}

Family<Histogram>& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                              const std::vector<std::string>& label_names,
                                              std::vector<double> bounds) {
  bool ok = !bounds.empty();
  for (size_t i = 0; ok && i < bounds.size(); ++i) {
    ok = std::isfinite(bounds[i]) && (i == 0 || bounds[i] > bounds[i - 1]);
  }
  if (!ok) {
    throw ConfigError("histogram " + name + ": buckets " + join(bounds) +
                      " must be finite and strictly increasing, at least one (+Inf is implied)");
  }
  FamilyDef def{name, help, MetricKind::kHistogram, label_names, std::move(bounds)};
  return static_cast<Family<Histogram>&>(*add(def, [&] {
    auto shared = std::make_shared<const std::vector<double>>(def.bounds);
    return std::make_shared<Family<Histogram>>(
        def, [shared] { return std::make_unique<Histogram>(shared); });
  }));
}

GaugeFnHandle MetricsRegistry::gauge_fn(const std::string& name, const std::string& help,
                                        const std::vector<std::string>& label_names,
                                        const std::vector<std::string>& label_values,
                                        std::function<double()> fn) {
  FamilyDef def{name, help, MetricKind::kGaugeFn, label_names, {}};
  auto family = std::static_pointer_cast<GaugeFnFamily>(
      add(def, [&] { return std::make_shared<GaugeFnFamily>(def); }));
  auto cb = family->add(label_values, std::move(fn));
  // The handle may outlive the registry: it holds the family weakly.
  std::weak_ptr<GaugeFnFamily> weak = family;
  return GaugeFnHandle([weak, label_values, cb] {
    if (auto f = weak.lock()) f->erase(label_values, cb);
    std::lock_guard<std::mutex> lock(cb->mutex);  // waits for a call in progress
    cb->fn = nullptr;
  });
}

std::string MetricsRegistry::render() const {
  std::vector<std::shared_ptr<FamilyBase>> families;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, family] : families_) families.push_back(family);
  }
  std::string out;
  for (const auto& family : families) family->render(&out);
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0) return "0";  // and -0
  char buf[64];
  std::to_chars_result r{};
  if (std::fabs(v) <= 9007199254740992.0 && v == std::trunc(v)) {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 0);
  } else {
    r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  }
  return std::string(buf, r.ptr);
}

std::string escape_label_value(const std::string& s) { return escape(s, true); }

std::string escape_help(const std::string& s) { return escape(s, false); }

bool valid_metric_name(const std::string& name) {
  if (name.empty() || !(name_start(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return name_char(c) || c == ':'; });
}

bool valid_label_name(const std::string& name) {
  if (name.empty() || !name_start(name[0]) || name.rfind("__", 0) == 0) return false;
  return std::all_of(name.begin(), name.end(), name_char);
}

}  // namespace fedwan::metrics
