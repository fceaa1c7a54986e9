// `fedwan costs [--rates FILE] [--window none|1h|6h|1d] [--json] RECORDS...`:
// bills each node from the costs.jsonl its rounds left (costs/cost_ledger.hpp
// holds the rules; this file finds and reads the files, cli/cost_report.hpp
// prints the bill).
#include <algorithm>
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
#include "cli/cost_report.hpp"
#include "common/terminal_text.hpp"
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
  CostFindings f;
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
  print_bill(std::cout, bill, f);
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
  add_ca_flags(*costs, args->ca, args->crl,
               "the federation CA (ca.pem): bill each record only to the node whose key signed it",
               "the CA's revocation list (crl.pem), with --ca");
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
