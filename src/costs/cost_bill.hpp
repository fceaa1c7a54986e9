// `fedwan costs`: the rates file that prices cost records, and the bill:
// per node, per UTC time window, and in total. Pure, like cost_records.hpp.
//
// Every total is a sum of integers, so it equals the sum of the per-round
// records exactly and in any order, and the windows partition it exactly:
// bytes as bytes, device time as whole device-microseconds (a record's
// train_seconds rounded to the nearest microsecond, times its devices).
// Money is derived: each node's integer totals times its rates, added over
// the nodes in name order; it is never rounded here (only for display).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "costs/cost_ledger.hpp"

namespace fedwan::costs {

// The rates file (YAML). Missing sections and keys cost 0.
struct CostRates {
  std::string currency = "units";
  // "default" or a node -> device kind -> price per device-hour.
  std::map<std::string, std::map<std::string, double>> device_hour;
  // "default", "<node>" or "<node>-><peer>" -> price per GB (1e9 bytes) sent.
  std::map<std::string, double> egress_gb;

  // The node's own price for the kind, else the default's, else 0.
  double device_hour_rate(const std::string& node, const std::string& kind) const;
  // "<node>-><peer>", else "<node>", else "default", else 0.
  double egress_rate(const std::string& node, const std::string& peer) const;
  // Keys naming a node (or a link) that no record has: most likely typos,
  // which would silently bill that node at the default.
  std::vector<std::string> unmatched(const std::vector<CostRecord>& records) const;
};

// Throws ConfigError "<origin>:<line>:<col>: <what>" for a negative or
// non-numeric rate, an unknown top-level key or device kind, a repeated key.
CostRates parse_cost_rates(const std::string& yaml_text, const std::string& origin);

// A node's device time of one kind, and its price (rate: node rows only).
struct DeviceUse {
  uint64_t us = 0;  // device-microseconds
  double rate = 0;  // per device-hour
  double cost = 0;
};

// A node's traffic on one link; egress is what it sent.
struct LinkUse {
  LinkBytes bytes;
  double rate = 0;  // per GB sent
  double cost = 0;
};

// One row of the bill: a node's (node and role set) or a sum of rows.
struct CostLine {
  std::string node, role;
  uint64_t rounds = 0;  // records
  uint64_t contributed = 0;
  std::map<std::string, DeviceUse> devices;  // by device kind
  std::map<std::string, LinkUse> links;      // by peer (node rows only)
  uint64_t device_us_total = 0;
  uint64_t sent = 0;
  uint64_t received = 0;
  double device_cost = 0;
  double egress_cost = 0;
  double total_cost = 0;

  double device_hours() const { return static_cast<double>(device_us_total) / 3.6e9; }
  double egress_gb() const { return static_cast<double>(sent) / 1e9; }
};

struct CostWindowBill {
  int64_t start = 0, end = 0;  // seconds since the epoch, [start, end)
  std::vector<CostLine> nodes;
  CostLine totals;
};

struct CostBill {
  std::string currency;
  uint64_t records = 0;         // records billed
  int64_t window_seconds = 0;   // 0: no windows
  std::vector<CostLine> nodes;  // by node name
  CostLine totals;
  std::vector<CostWindowBill> windows;  // those with records, in time order
};

// "none" -> 0, "1h", "6h", "1d" -> seconds; ConfigError otherwise.
int64_t cost_window_seconds(const std::string& name);

// Prices `records` (one per node and round); with `window_seconds` > 0 also
// splits them by the UTC window (aligned to the epoch) holding their end.
// Throws ConfigError when a sum would pass 2^64.
CostBill bill_costs(const std::vector<CostRecord>& records, const CostRates& rates,
                    int64_t window_seconds);

}  // namespace fedwan::costs
