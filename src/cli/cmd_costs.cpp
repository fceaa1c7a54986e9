// `fedwan costs [--rates FILE] [--window none|1h|6h|1d] [--json] RECORDS...`:
// bills each node from the costs.jsonl its rounds left (cli/cost_records.hpp
// holds the rules; this file finds the files and prints the bill).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/cost_records.hpp"
#include "fedwan/error.hpp"

namespace fedwan::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct CostsArgs {
  std::vector<std::string> records;
  std::string rates;
  std::string window = "none";
  bool json = false;
};

constexpr const char* kCostsNote =
    "Each node writes one line per round to its costs.jsonl (schema version 1): train_seconds, "
    "devices and device (cpu|gpu) for sites, and per link the bytes sent and received. A "
    "directory is searched recursively for files named costs.jsonl. A round written twice "
    "(a node restarted) is counted once when the two lines agree, and refused when they do "
    "not.\n"
    "Device time is billed to the node that trained, egress to the node that sent the bytes. "
    "The rates file (YAML) has currency, device_hour (default and per node: cpu/gpu per "
    "device-hour) and egress_gb (per GB of 1e9 bytes sent; '<node>-><peer>' over '<node>' "
    "over 'default'); whatever it leaves out costs 0.\n"
    "A window holds the records whose end falls in it (UTC, aligned to midnight). Bytes and "
    "device-microseconds are summed as integers: the totals equal the sums of the rounds, "
    "and the windows add up to them, exactly. Money is shown to 2 decimals; --json keeps it "
    "in full. See docs/operations.md, \"Cost accounting\".\n";

// Records are untrusted input and this goes to a terminal: control
// characters (escape sequences) are shown as '?'.
std::string printable(std::string s) {
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return s;
}

// Every costs.jsonl the arguments name, each once, in a stable order.
std::vector<std::string> cost_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  std::set<fs::path> seen;
  const auto take = [&](const fs::path& p) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(p, ec);
    if (seen.insert(ec ? p : canonical).second) out.push_back(p.string());
  };
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (!fs::exists(st)) throw ConfigError(p + ": no such file or directory");
    if (!fs::is_directory(st)) {
      take(p);
      continue;
    }
    std::vector<fs::path> found;
    fs::recursive_directory_iterator it(p, ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code type_ec;
      if (it->path().filename() == "costs.jsonl" && it->is_regular_file(type_ec)) {
        found.push_back(it->path());
      }
    }
    if (ec) throw ConfigError("cannot search " + p + ": " + ec.message());
    if (found.empty()) {
      throw ConfigError(p + ": no costs.jsonl under this directory (nodes write their cost "
                            "records to files of that name)");
    }
    std::sort(found.begin(), found.end());
    for (const fs::path& f : found) take(f);
  }
  return out;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Columns: the first two left-aligned, the rest right-aligned.
class Table {
 public:
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void rule() { rows_.emplace_back(); }
  void print(std::ostream& out) const {
    std::vector<size_t> width;
    for (const auto& r : rows_) {
      width.resize(std::max(width.size(), r.size()));
      for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    size_t total = 0;
    for (size_t w : width) total += w + 2;
    for (const auto& r : rows_) {
      if (r.empty()) {
        out << std::string(total > 2 ? total - 2 : 0, '-') << "\n";
        continue;
      }
      std::string line;
      for (size_t i = 0; i < r.size(); ++i) {
        const std::string pad(width[i] - r[i].size(), ' ');
        line += i < 2 ? r[i] + pad : pad + r[i];
        if (i + 1 < r.size()) line += "  ";
      }
      out << line.substr(0, line.find_last_not_of(' ') + 1) << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::vector<std::string> cells(const CostLine& l, const std::string& name) {
  return {printable(name),
          printable(l.role),
          std::to_string(l.rounds),
          std::to_string(l.contributed),
          fixed(l.device_hours(), 3),
          fixed(l.device_cost, 2),
          fixed(l.egress_gb(), 3),
          fixed(l.egress_cost, 2),
          fixed(l.total_cost, 2)};
}

void print_table(std::ostream& out, const std::vector<CostLine>& nodes, const CostLine& totals,
                 const std::string& total_name, const std::string& currency) {
  const std::string c = printable(currency);
  Table t;
  t.row({"node", "role", "rounds", "contributed", "device-h", "device " + c, "egress GB",
         "egress " + c, "total " + c});
  for (const CostLine& l : nodes) t.row(cells(l, l.node));
  t.rule();
  t.row(cells(totals, total_name));
  t.print(out);
}

json line_json(const CostLine& l) {
  json j;
  const bool node_row = !l.node.empty();
  if (node_row) {
    j["node"] = l.node;
    j["role"] = l.role;
  }
  j["rounds"] = l.rounds;
  j["contributed"] = l.contributed;
  j["device_microseconds"] = l.device_us_total;
  j["device_hours"] = l.device_hours();
  j["device_cost"] = l.device_cost;
  j["egress_bytes"] = l.sent;
  j["received_bytes"] = l.received;
  j["egress_gb"] = l.egress_gb();
  j["egress_cost"] = l.egress_cost;
  j["total_cost"] = l.total_cost;
  json kinds = json::object();
  for (const auto& [kind, use] : l.devices) {
    json k = {{"device_microseconds", use.us},
              {"device_hours", static_cast<double>(use.us) / 3.6e9},
              {"cost", use.cost}};
    if (node_row) k["rate"] = use.rate;
    kinds[kind] = std::move(k);
  }
  j["device_by_kind"] = std::move(kinds);
  if (node_row) {
    json links = json::object();
    for (const auto& [peer, use] : l.links) {
      links[peer] = {{"sent", use.bytes.sent},
                     {"received", use.bytes.received},
                     {"rate", use.rate},
                     {"cost", use.cost}};
    }
    j["links"] = std::move(links);
  }
  return j;
}

json bill_json(const CostBill& b, const std::string& window, size_t files) {
  json j;
  j["currency"] = b.currency;
  j["files"] = files;
  j["records_read"] = b.lines_read;
  j["records"] = b.records;
  j["duplicates"] = b.duplicates;
  j["window"] = b.window_seconds > 0 ? json(window) : json(nullptr);
  j["nodes"] = json::array();
  for (const CostLine& l : b.nodes) j["nodes"].push_back(line_json(l));
  j["totals"] = line_json(b.totals);
  j["windows"] = json::array();
  for (const CostWindowBill& w : b.windows) {
    json wj;
    wj["start"] = format_utc(w.start);
    wj["end"] = format_utc(w.end);
    wj["nodes"] = json::array();
    for (const CostLine& l : w.nodes) wj["nodes"].push_back(line_json(l));
    wj["totals"] = line_json(w.totals);
    j["windows"].push_back(std::move(wj));
  }
  return j;
}

int run_costs(const CostsArgs& a) {
  const int64_t window_seconds = cost_window_seconds(a.window);
  CostRates rates;
  if (!a.rates.empty()) {
    std::ifstream in(a.rates, std::ios::binary);
    if (!in) throw ConfigError("cannot read rates file " + a.rates);
    std::stringstream text;
    text << in.rdbuf();
    if (in.bad()) throw ConfigError("cannot read rates file " + a.rates);
    rates = parse_cost_rates(text.str(), a.rates);
  }
  const std::vector<std::string> files = cost_files(a.records);
  CostLedger ledger;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw ConfigError("cannot read cost records " + f);
    ledger.read(in, f);
  }
  for (const std::string& key : rates.unmatched(ledger)) {
    std::cerr << "warning: " << a.rates << ": " << printable(key)
              << " names no node or link in the records (a typo bills that node at the "
                 "default)\n";
  }
  const CostBill bill = bill_costs(ledger, rates, window_seconds);
  if (a.json) {
    std::cout << bill_json(bill, a.window, files.size())
                     .dump(2, ' ', false, json::error_handler_t::replace)
              << "\n";
    return 0;
  }
  std::cout << bill.records << (bill.records == 1 ? " round record" : " round records") << " from "
            << files.size() << (files.size() == 1 ? " file" : " files");
  if (bill.duplicates > 0) {
    std::cout << " (" << bill.duplicates << " more written twice, counted once)";
  }
  std::cout << "; prices in " << printable(bill.currency) << "\n\n";
  print_table(std::cout, bill.nodes, bill.totals, "total", bill.currency);
  for (const CostWindowBill& w : bill.windows) {
    std::cout << "\nwindow " << format_utc(w.start) << " .. " << format_utc(w.end) << "\n";
    print_table(std::cout, w.nodes, w.totals, "window total", bill.currency);
  }
  return 0;
}

}  // namespace

void add_costs_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<CostsArgs>();
  CLI::App* costs = app.add_subcommand(
      "costs", "bill each node's device time and egress from its per-round cost records");
  costs
      ->add_option("records", args->records,
                   "costs.jsonl files, or directories searched for them recursively")
      ->required()
      ->check(CLI::ExistingPath);
  costs->add_option("--rates", args->rates, "rates file (YAML); without one everything costs 0")
      ->check(CLI::ExistingFile);
  costs
      ->add_option("--window", args->window,
                   "also split the bill by UTC window of this length (a record belongs to the "
                   "window holding its end)")
      ->check(CLI::IsMember({"none", "1h", "6h", "1d"}))
      ->capture_default_str();
  costs->add_flag("--json", args->json,
                  "print the bill as one JSON object (nodes, windows, totals, currency, record "
                  "counts), money unrounded");
  costs->footer(kCostsNote);
  costs->callback([args, exit_code] { *exit_code = run_costs(*args); });
}

}  // namespace fedwan::cli
