// `fedwan costs`: pricing the records (cost_bill.hpp).
#include "costs/cost_bill.hpp"

#include <algorithm>

#include "fedwan/error.hpp"

namespace fedwan::costs {
namespace {

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// Sums and products that would wrap are refused: a wrapped total is a wrong bill.
void add_to(uint64_t& acc, uint64_t v) {
  if (__builtin_add_overflow(acc, v, &acc)) {
    throw ConfigError("the totals pass 2^64 (bytes or device-microseconds): the records cannot "
                      "be summed exactly; bill fewer of them at once");
  }
}

}  // namespace

int64_t cost_window_seconds(const std::string& name) {
  if (name == "none") return 0;
  if (name == "1h") return 3600;
  if (name == "6h") return int64_t{6} * 3600;
  if (name == "1d") return 86400;
  throw ConfigError("window '" + name + "': expected none, 1h, 6h or 1d");
}

namespace {

CostLine node_line(const std::vector<const CostRecord*>& records, const CostRates& rates) {
  CostLine l;
  l.node = records.front()->node;
  l.role = records.front()->role;
  for (const CostRecord* r : records) {
    ++l.rounds;
    l.contributed += r->contributed;
    if (r->device_us > 0) {
      add_to(l.devices[r->device].us, r->device_us);
      add_to(l.device_us_total, r->device_us);
    }
    for (const auto& [peer, bytes] : r->links) {
      LinkBytes& link = l.links[peer].bytes;
      add_to(link.sent, bytes.sent);
      add_to(link.received, bytes.received);
      add_to(l.sent, bytes.sent);
      add_to(l.received, bytes.received);
    }
  }
  // Priced once from the integer totals (not summed per round): one rounding each.
  for (auto& [kind, use] : l.devices) {
    use.rate = rates.device_hour_rate(l.node, kind);
    use.cost = static_cast<double>(use.us) / 3.6e9 * use.rate;
    l.device_cost += use.cost;
  }
  for (auto& [peer, use] : l.links) {
    use.rate = rates.egress_rate(l.node, peer);
    use.cost = static_cast<double>(use.bytes.sent) / 1e9 * use.rate;
    l.egress_cost += use.cost;
  }
  l.total_cost = l.device_cost + l.egress_cost;
  return l;
}

CostLine sum_of(const std::vector<CostLine>& lines) {
  CostLine t;
  for (const CostLine& l : lines) {
    add_to(t.rounds, l.rounds);
    add_to(t.contributed, l.contributed);
    for (const auto& [kind, use] : l.devices) {
      add_to(t.devices[kind].us, use.us);
      t.devices[kind].cost += use.cost;
    }
    add_to(t.device_us_total, l.device_us_total);
    add_to(t.sent, l.sent);
    add_to(t.received, l.received);
    t.device_cost += l.device_cost;
    t.egress_cost += l.egress_cost;
    t.total_cost += l.total_cost;
  }
  return t;
}

// One line per node, in name order (the records' map order).
std::vector<CostLine> node_lines(const std::vector<const CostRecord*>& records,
                                 const CostRates& rates) {
  std::vector<CostLine> out;
  std::vector<const CostRecord*> same_node;
  for (const CostRecord* r : records) {
    if (!same_node.empty() && same_node.front()->node != r->node) {
      out.push_back(node_line(same_node, rates));
      same_node.clear();
    }
    same_node.push_back(r);
  }
  if (!same_node.empty()) out.push_back(node_line(same_node, rates));
  return out;
}

}  // namespace

CostBill bill_costs(const std::vector<CostRecord>& records, const CostRates& rates,
                    int64_t window_seconds) {
  CostBill bill;
  bill.currency = rates.currency;
  bill.records = records.size();
  bill.window_seconds = window_seconds;
  std::vector<const CostRecord*> all;
  all.reserve(records.size());
  for (const CostRecord& r : records) all.push_back(&r);
  // By node, then round: node_lines() takes each node's records together.
  std::sort(all.begin(), all.end(), [](const CostRecord* a, const CostRecord* b) {
    return a->node != b->node ? a->node < b->node : a->round < b->round;
  });
  std::map<int64_t, std::vector<const CostRecord*>> by_window;
  if (window_seconds > 0) {
    for (const CostRecord* r : all) {
      by_window[floor_div(r->end_time.seconds, window_seconds)].push_back(r);
    }
  }
  bill.nodes = node_lines(all, rates);
  bill.totals = sum_of(bill.nodes);
  for (const auto& [index, records] : by_window) {
    CostWindowBill w;
    w.start = index * window_seconds;
    w.end = w.start + window_seconds;
    w.nodes = node_lines(records, rates);
    w.totals = sum_of(w.nodes);
    bill.windows.push_back(std::move(w));
  }
  return bill;
}

}  // namespace fedwan::costs
