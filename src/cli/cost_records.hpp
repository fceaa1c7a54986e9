// `fedwan costs`: the per-round cost records nodes write (costs.jsonl, schema
// version 1), the rates file that prices them, and the bill: per node, per
// UTC time window, and in total. Pure: no file system (cmd_costs.cpp finds
// and opens the files), so every rule here is unit-tested on strings.
//
// Every total is a sum of integers, so it equals the sum of the per-round
// records exactly and in any order, and the windows partition it exactly:
// bytes as bytes, device time as whole device-microseconds (a record's
// train_seconds rounded to the nearest microsecond, times its devices).
// Money is derived: each node's integer totals times its rates, added over
// the nodes in name order; it is never rounded here (only for display).
//
// Thread safety: none needed; a CostLedger is built and read by one thread.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fedwan::cli {

// A point in time from a record: seconds since 1970-01-01T00:00:00Z and the
// nanoseconds into that second.
struct UtcTime {
  int64_t seconds = 0;
  uint32_t nanos = 0;
  bool operator<(const UtcTime& o) const {
    return seconds != o.seconds ? seconds < o.seconds : nanos < o.nanos;
  }
};

// "2026-11-25T07:00:12.600Z" (fraction optional, up to 9 digits, UTC only):
// false, with `why` set, for anything else or an impossible date.
bool parse_utc(const std::string& text, UtcTime* out, std::string* why);
// "2026-11-25T07:00:00Z".
std::string format_utc(int64_t seconds);

struct LinkBytes {
  uint64_t sent = 0;  // billed to the record's node
  uint64_t received = 0;
  bool operator==(const LinkBytes& o) const { return sent == o.sent && received == o.received; }
};

// One node's costs in one round, as it wrote them.
struct CostRecord {
  std::string node;
  std::string role;  // "site", "region" or "root"
  uint64_t round = 0;
  std::string start, end;  // as written
  UtcTime end_time;
  double train_seconds = 0;  // wall time the devices trained; 0 for aggregators
  uint64_t devices = 0;
  std::string device;  // "cpu" or "gpu"; empty only when no device time
  bool contributed = false;
  std::map<std::string, LinkBytes> links;  // by peer
  uint64_t device_us = 0;                  // round(train_seconds * 1e6) * devices
  std::string origin;                      // "file:line"

  // Which recorded field differs from `o` ("" when none does).
  std::string first_difference(const CostRecord& o) const;
};

constexpr int kCostSchemaVersion = 1;
constexpr size_t kCostMaxLineBytes = 1 << 20;

// One JSON Lines line. Throws ConfigError "<origin>: <what is wrong>".
// Unknown fields are ignored.
CostRecord parse_cost_record(const std::string& line, const std::string& origin);

// The distinct records of a run, keyed by (node, round). Thread safety: none.
class CostLedger {
 public:
  // A record seen before, field for field, is counted once (a node that
  // restarted writes its round again); one that differs from it is a
  // ConfigError naming both lines, as is a node changing its role.
  void add(CostRecord r);
  // Reads JSON Lines from `in`, naming lines "<name>:<line>". Blank lines
  // carry nothing and are passed over; any other bad line is a ConfigError.
  void read(std::istream& in, const std::string& name);

  const std::map<std::pair<std::string, uint64_t>, CostRecord>& records() const { return records_; }
  uint64_t lines_read() const { return lines_read_; }  // records read, duplicates included
  uint64_t duplicates() const { return duplicates_; }

 private:
  std::map<std::pair<std::string, uint64_t>, CostRecord> records_;
  std::map<std::string, std::pair<std::string, std::string>> roles_;  // node -> role, origin
  uint64_t lines_read_ = 0;
  uint64_t duplicates_ = 0;
};

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
  std::vector<std::string> unmatched(const CostLedger& ledger) const;
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
  uint64_t lines_read = 0, records = 0, duplicates = 0;
  int64_t window_seconds = 0;   // 0: no windows
  std::vector<CostLine> nodes;  // by node name
  CostLine totals;
  std::vector<CostWindowBill> windows;  // those with records, in time order
};

// "none" -> 0, "1h", "6h", "1d" -> seconds; ConfigError otherwise.
int64_t cost_window_seconds(const std::string& name);

// Prices every record; with `window_seconds` > 0 also splits them by the UTC
// window (aligned to the epoch) holding their end. Throws ConfigError when a
// sum would pass 2^64.
CostBill bill_costs(const CostLedger& ledger, const CostRates& rates, int64_t window_seconds);

}  // namespace fedwan::cli
