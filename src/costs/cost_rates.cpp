// The rates file of `fedwan costs` (costs/cost_ledger.hpp): prices per
// device-hour and per GB of egress, and their lookup (link over node over
// default).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "costs/cost_bill.hpp"
#include "fedwan/error.hpp"

namespace fedwan::costs {
namespace {

const char* const kDeviceKinds[] = {"cpu", "gpu"};

bool is_device_kind(const std::string& s) {
  return std::find(std::begin(kDeviceKinds), std::end(kDeviceKinds), s) != std::end(kDeviceKinds);
}

}  // namespace

double CostRates::device_hour_rate(const std::string& node, const std::string& kind) const {
  for (const std::string& key : {node, std::string("default")}) {
    const auto n = device_hour.find(key);
    if (n == device_hour.end()) continue;
    const auto k = n->second.find(kind);
    if (k != n->second.end()) return k->second;
  }
  return 0;
}

double CostRates::egress_rate(const std::string& node, const std::string& peer) const {
  std::string link = node;
  link += "->";
  link += peer;
  for (const std::string& key : {link, node, std::string("default")}) {
    const auto it = egress_gb.find(key);
    if (it != egress_gb.end()) return it->second;
  }
  return 0;
}

std::vector<std::string> CostRates::unmatched(const std::vector<CostRecord>& records) const {
  std::set<std::string> nodes, links;
  for (const CostRecord& r : records) {
    nodes.insert(r.node);
    for (const auto& link : r.links) links.insert(r.node + "->" + link.first);
  }
  std::vector<std::string> out;
  for (const auto& entry : device_hour) {
    if (entry.first != "default" && !nodes.count(entry.first)) {
      out.push_back("device_hour." + entry.first);
    }
  }
  for (const auto& entry : egress_gb) {
    const std::string& k = entry.first;
    const bool link = k.find("->") != std::string::npos;
    if (k != "default" && !(link ? links.count(k) : nodes.count(k)))
      out.push_back("egress_gb." + k);
  }
  return out;
}

namespace {

class RatesReader {
 public:
  explicit RatesReader(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
    std::string where = origin_;
    if (at && !at.Mark().is_null()) {
      where +=
          ":" + std::to_string(at.Mark().line + 1) + ":" + std::to_string(at.Mark().column + 1);
    }
    throw ConfigError(where + ": " + what);
  }
  struct Entry {
    std::string name;
    YAML::Node key, value;
  };
  // The keys of a mapping, each once (yaml-cpp would keep only one of a
  // repeated key, silently dropping a price).
  std::vector<Entry> entries(const YAML::Node& map, const std::string& ctx) const {
    if (!map.IsMap()) fail(map, ctx + ": expected a mapping of key: value");
    std::vector<Entry> out;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar() || it->first.Scalar().empty()) {
        fail(it->first, ctx + ": keys must be plain names");
      }
      const std::string& key = it->first.Scalar();
      for (const Entry& e : out) {
        if (e.name == key) {
          std::string why = ctx;
          why += ": key '" + key + "' given twice";
          fail(it->first, why);
        }
      }
      out.push_back({key, it->first, it->second});
    }
    return out;
  }
  double rate(const YAML::Node& n, const std::string& ctx) const {
    const std::string s = n.IsScalar() ? n.Scalar() : std::string();
    double v = 0;
    const auto res = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size() || !std::isfinite(v) ||
        v < 0) {
      fail(n, ctx + ": a rate must be a non-negative number, got '" + s + "'");
    }
    return v;
  }

 private:
  const std::string& origin_;
};

}  // namespace

CostRates parse_cost_rates(const std::string& text, const std::string& origin) {
  const RatesReader in(origin);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": not valid YAML: " + e.msg);
  }
  CostRates rates;
  if (!root || root.IsNull()) return rates;  // an empty file: everything costs 0
  for (const auto& [key, key_node, value] : in.entries(root, "rates")) {
    if (key == "currency") {
      if (!value.IsScalar() || value.Scalar().empty()) {
        in.fail(value, "currency: must be a label such as EUR");
      }
      rates.currency = value.Scalar();
    } else if (key == "device_hour") {
      if (value.IsNull()) continue;
      for (const auto& [node, node_key, kinds] : in.entries(value, "device_hour")) {
        auto& prices = rates.device_hour[node];
        if (kinds.IsNull()) continue;
        for (const auto& [kind, kind_key, price] : in.entries(kinds, "device_hour." + node)) {
          if (!is_device_kind(kind)) {
            std::string why = "device_hour." + node;
            why += ": unknown device kind '" + kind + "'; known kinds are cpu, gpu";
            in.fail(kind_key, why);
          }
          std::string what = "device_hour." + node;
          what += "." + kind;
          prices[kind] = in.rate(price, what);
        }
      }
    } else if (key == "egress_gb") {
      if (value.IsNull()) continue;
      for (const auto& [name, name_key, price] : in.entries(value, "egress_gb")) {
        const size_t arrow = name.find("->");
        if (arrow != std::string::npos && (arrow == 0 || arrow + 2 == name.size() ||
                                           name.find("->", arrow + 2) != std::string::npos)) {
          in.fail(name_key,
                  "egress_gb: '" + name + "' is neither a node nor a link <node>-><peer>");
        }
        rates.egress_gb[name] = in.rate(price, "egress_gb." + name);
      }
    } else {
      in.fail(key_node, "unknown top-level key '" + key +
                            "'; known keys are currency, device_hour, egress_gb");
    }
  }
  return rates;
}

}  // namespace fedwan::costs
