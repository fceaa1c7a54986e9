// `fedwan costs [--rates FILE] [--window none|1h|6h|1d] [--json] RECORDS...`:
// bills each node from the costs.jsonl its rounds left (costs/cost_ledger.hpp
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
#include "common/terminal_text.hpp"
#include "common/utc_time.hpp"
#include "costs/cost_bill.hpp"
#include "costs/cost_checks.hpp"
#include "costs/cost_ledger.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "security/node_key.hpp"

namespace fedwan::cli {

using namespace fedwan::costs;  // the ledger, the bill and its checks
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct CostsArgs {
  std::vector<std::string> records;
  std::string rates;
  std::string window = "none";
  bool json = false;
  std::string ca, crl, topology, job;
  bool on_their_word = false;
};

constexpr const char* kCostsNote =
    "Each node writes one line per round to its costs.jsonl (schema version 2), signed with "
    "its own key: train_seconds, devices and device (cpu|gpu) for sites, and per link the bytes "
    "sent and received. A directory is searched recursively for files named costs.jsonl.\n"
    "With --ca a record is billed only to the node whose key signed it (a certificate of that "
    "CA, not revoked in --crl, naming the record's node, role and job); any other line is "
    "refused and reported, and the rest still bills. --unverified takes records on their word "
    "instead, and the bill says so.\n"
    "A site's training time is bounded by its round's wall time (its parent's record) and, "
    "with --topology, its devices by the site's `devices`; a record past them is refused. The "
    "bytes between a child and its parent are billed at the parent's count; a child whose own "
    "count differs by more than 1% and 64 KiB is reported with both figures. A node that wrote "
    "a round twice is counted once; two different records of one round bill the larger.\n"
    "Device time is billed to the node that trained, egress to the node that sent the bytes. "
    "The rates file (YAML) has currency, device_hour (default and per node: cpu/gpu per "
    "device-hour) and egress_gb (per GB of 1e9 bytes sent; '<node>-><peer>' over '<node>' "
    "over 'default'); whatever it leaves out costs 0.\n"
    "A window holds the records whose end falls in it (UTC, aligned to midnight). Totals are "
    "exact integer sums. Exit 0: everything verified and consistent; 3: billed, but some "
    "records were refused or a link's counts differ (listed); 2: no bill. See "
    "docs/operations.md, \"Cost accounting\".\n";

// Records are untrusted input and this goes to a terminal.
std::string printable(const std::string& s) { return terminal_text(s); }

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

// Everything `fedwan costs` learnt about the records besides the bill.
struct Findings {
  std::vector<std::string> files;
  const CostLedger* ledger = nullptr;
  const CheckedCosts* checked = nullptr;
  std::string ca, crl, topology;

  std::vector<CostRefusal> refused() const {
    std::vector<CostRefusal> all = ledger->refusals();
    all.insert(all.end(), checked->refused.begin(), checked->refused.end());
    return all;
  }
  std::vector<const LinkReconciliation*> mismatches() const {
    std::vector<const LinkReconciliation*> out;
    for (const LinkReconciliation& l : checked->links) {
      if (l.mismatch) out.push_back(&l);
    }
    return out;
  }
  bool clean() const {
    return refused().empty() && mismatches().empty() && ledger->conflicts().empty();
  }
};

std::string refusal_text(const CostRefusal& r) {
  std::string who;
  if (!r.node.empty()) {
    who = printable(r.node) + (r.round ? " round " + std::to_string(*r.round) : "") + ": ";
  }
  return printable(r.origin) + ": " + who + printable(r.reason);
}

json verification_json(const Findings& f) {
  const CostLedger& l = *f.ledger;
  const CheckedCosts& c = *f.checked;
  json v;
  v["signatures"] = l.trust().ca ? json("verified") : json("not checked (--unverified)");
  v["ca"] = f.ca.empty() ? json(nullptr) : json(f.ca);
  v["crl"] = f.crl.empty() ? json(nullptr) : json(f.crl);
  v["topology"] = f.topology.empty() ? json(nullptr) : json(f.topology);
  v["records_verified"] = l.verified();
  v["device_records"] = c.device_records;
  v["wall_time_from_parent"] = c.wall_from_parent;
  v["devices_from_topology"] = c.devices_from_topology;
  json links = json::array();
  for (const LinkReconciliation& r : c.links) {
    links.push_back({{"child", r.child},
                     {"parent", r.parent},
                     {"child_sent", r.child_sent},
                     {"parent_received", r.parent_received},
                     {"child_received", r.child_received},
                     {"parent_sent", r.parent_sent},
                     {"rounds_at_parent_count", r.rounds_both},
                     {"rounds_declared_by_child", r.rounds_child_only},
                     {"rounds_child_unrecorded", r.rounds_parent_only},
                     {"mismatch", r.mismatch}});
  }
  v["links"] = std::move(links);
  return v;
}

json findings_json(const Findings& f) {
  json j;
  j["refused"] = json::array();
  for (const CostRefusal& r : f.refused()) {
    j["refused"].push_back({{"origin", r.origin},
                            {"node", r.node.empty() ? json(nullptr) : json(r.node)},
                            {"round", r.round ? json(*r.round) : json(nullptr)},
                            {"reason", r.reason}});
  }
  j["conflicts"] = json::array();
  for (const CostConflict& c : f.ledger->conflicts()) {
    j["conflicts"].push_back({{"node", c.node},
                              {"round", c.round},
                              {"billed", c.billed_origin},
                              {"other", c.other_origin},
                              {"difference", c.difference}});
  }
  return j;
}

json bill_json(const CostBill& b, const std::string& window, const Findings& f) {
  json j;
  j["currency"] = b.currency;
  j["files"] = f.files.size();
  j["records_read"] = f.ledger->lines_read();
  j["records"] = b.records;
  j["duplicates"] = f.ledger->duplicates();
  j["window"] = b.window_seconds > 0 ? json(window) : json(nullptr);
  j["verification"] = verification_json(f);
  const json found = findings_json(f);
  j["refused"] = found["refused"];
  j["conflicts"] = found["conflicts"];
  j["nodes"] = json::array();
  for (const CostLine& l : b.nodes) j["nodes"].push_back(line_json(l));
  j["totals"] = line_json(b.totals);
  j["windows"] = json::array();
  for (const CostWindowBill& w : b.windows) {
    json wj;
    wj["start"] = utc_text(w.start);
    wj["end"] = utc_text(w.end);
    wj["nodes"] = json::array();
    for (const CostLine& l : w.nodes) wj["nodes"].push_back(line_json(l));
    wj["totals"] = line_json(w.totals);
    j["windows"].push_back(std::move(wj));
  }
  return j;
}

// What the bill rests on, in words, before the table.
void print_verification(std::ostream& out, const CostBill& bill, const Findings& f) {
  const CostLedger& l = *f.ledger;
  const CheckedCosts& c = *f.checked;
  out << bill.records << (bill.records == 1 ? " round record" : " round records") << " billed from "
      << f.files.size() << (f.files.size() == 1 ? " file" : " files");
  if (l.duplicates() > 0) out << " (" << l.duplicates() << " more written twice, counted once)";
  out << "; prices in " << printable(bill.currency) << "\n";
  if (l.trust().ca) {
    out << "signatures: " << l.verified() << " records signed by their own node (CA "
        << printable(f.ca) << (f.crl.empty() ? "" : ", CRL " + printable(f.crl)) << ")\n";
  } else {
    out << "signatures: NOT CHECKED (--unverified): every figure is its node's own word\n";
  }
  out << "device time: " << c.device_records << " site records; " << c.wall_from_parent
      << " bounded by their parent's round time, the rest by their own; devices: "
      << c.devices_from_topology << " bounded by the topology, "
      << c.device_records - std::min(c.device_records, c.devices_from_topology) << " declared\n";
  uint64_t both = 0, child_only = 0, parent_only = 0;
  for (const LinkReconciliation& r : c.links) {
    both += r.rounds_both;
    child_only += r.rounds_child_only;
    parent_only += r.rounds_parent_only;
  }
  out << "link bytes: " << c.links.size()
      << " child links; rounds billed at the parent's count: " << both + parent_only << " ("
      << parent_only << " the child did not record), on the child's word: " << child_only << "\n";
  const std::vector<CostRefusal> refused = f.refused();
  if (!refused.empty()) {
    out << "\nrefused, not billed (" << refused.size() << "):\n";
    for (const CostRefusal& r : refused) out << "  " << refusal_text(r) << "\n";
  }
  if (!l.conflicts().empty()) {
    out << "\nrounds a node recorded twice, differently (the larger is billed):\n";
    for (const CostConflict& x : l.conflicts()) {
      out << "  " << printable(x.node) << " round " << x.round << ": " << printable(x.billed_origin)
          << " billed, " << printable(x.other_origin) << " not (" << x.difference << ")\n";
    }
  }
  const auto mismatches = f.mismatches();
  if (!mismatches.empty()) {
    out << "\nlinks whose two ends disagree (billed at the parent's count):\n";
    for (const LinkReconciliation* m : mismatches) {
      out << "  " << printable(m->child) << " -> " << printable(m->parent) << ": "
          << printable(m->child) << " says it sent " << m->child_sent << " B, "
          << printable(m->parent) << " received " << m->parent_received << " B; "
          << printable(m->parent) << " sent " << m->parent_sent << " B, " << printable(m->child)
          << " says it received " << m->child_received << " B\n";
    }
  }
  out << "\n";
}

std::unique_ptr<CostLedger> read_ledger(const CostsArgs& a, const std::vector<std::string>& files,
                                        const security::SignatureVerifier* ca,
                                        const std::optional<Topology>& topo) {
  CostTrust trust;
  trust.ca = ca;
  trust.on_their_word = a.on_their_word;
  trust.job = topo ? topo->job() : a.job;
  if (topo && !a.job.empty() && a.job != topo->job()) {
    throw ConfigError("--job " + a.job + " but the topology is of job " + topo->job());
  }
  auto ledger = std::make_unique<CostLedger>(trust);
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw ConfigError("cannot read cost records " + f);
    ledger->read(in, f);
  }
  if (trust.job.empty() && ledger->jobs().size() > 1) {
    std::string jobs;
    for (const std::string& j : ledger->jobs()) jobs += (jobs.empty() ? "" : ", ") + printable(j);
    throw ConfigError("records of several jobs (" + jobs +
                      "): bill one at a time with --job or --topology");
  }
  return ledger;
}

int run_costs(const CostsArgs& a) {
  const int64_t window_seconds = cost_window_seconds(a.window);
  if (a.ca.empty() == !a.on_their_word) {
    throw ConfigError(a.on_their_word
                          ? "--ca and --unverified exclude each other"
                          : "give --ca PKI/ca/ca.pem (the federation CA: each record must be "
                            "signed by its own node), or --unverified to bill records on their "
                            "word");
  }
  if (!a.crl.empty() && a.ca.empty()) throw ConfigError("--crl needs --ca");
  CostRates rates;
  if (!a.rates.empty()) {
    std::ifstream in(a.rates, std::ios::binary);
    if (!in) throw ConfigError("cannot read rates file " + a.rates);
    std::stringstream text;
    text << in.rdbuf();
    if (in.bad()) throw ConfigError("cannot read rates file " + a.rates);
    rates = parse_cost_rates(text.str(), a.rates);
  }
  std::optional<Topology> topo;
  if (!a.topology.empty()) topo = Topology::load(a.topology);
  std::unique_ptr<security::SignatureVerifier> ca;
  if (!a.ca.empty()) ca = std::make_unique<security::SignatureVerifier>(a.ca, a.crl);
  Findings f;
  f.files = cost_files(a.records);
  f.ca = a.ca;
  f.crl = a.crl;
  f.topology = a.topology;
  const std::unique_ptr<CostLedger> ledger = read_ledger(a, f.files, ca.get(), topo);
  const CheckedCosts checked = check_costs(*ledger, topo ? &*topo : nullptr);
  f.ledger = ledger.get();
  f.checked = &checked;
  for (const std::string& key : rates.unmatched(checked.billed)) {
    std::cerr << "warning: " << a.rates << ": " << printable(key)
              << " names no node or link in the records (a typo bills that node at the "
                 "default)\n";
  }
  const CostBill bill = bill_costs(checked.billed, rates, window_seconds);
  const int code = f.clean() ? 0 : 3;
  if (a.json) {
    std::cout << bill_json(bill, a.window, f).dump(2, ' ', false, json::error_handler_t::replace)
              << "\n";
    return code;
  }
  print_verification(std::cout, bill, f);
  print_table(std::cout, bill.nodes, bill.totals, "total", bill.currency);
  for (const CostWindowBill& w : bill.windows) {
    std::cout << "\nwindow " << utc_text(w.start) << " .. " << utc_text(w.end) << "\n";
    print_table(std::cout, w.nodes, w.totals, "window total", bill.currency);
  }
  return code;
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
  costs
      ->add_option("--ca", args->ca,
                   "the federation CA (ca.pem): bill each record only to the node whose key "
                   "signed it")
      ->check(CLI::ExistingFile);
  costs->add_option("--crl", args->crl, "the CA's revocation list (crl.pem), with --ca")
      ->check(CLI::ExistingFile);
  costs->add_flag("--unverified", args->on_their_word,
                  "bill records on their word, signed or not (no --ca); the bill says so");
  costs
      ->add_option("--topology", args->topology,
                   "the federation's topology: who is whose parent, the devices each site "
                   "may bill, the job")
      ->check(CLI::ExistingFile);
  costs->add_option("--job", args->job, "bill only this job's records (default: --topology's)");
  costs->add_flag("--json", args->json,
                  "print the bill as one JSON object (nodes, windows, totals, currency, record "
                  "counts), money unrounded");
  costs->footer(kCostsNote);
  costs->callback([args, exit_code] { *exit_code = run_costs(*args); });
}

}  // namespace fedwan::cli
