// What `fedwan costs` prints: the bill and what it rests on, as text or as
// one JSON object.
#include "cli/cost_report.hpp"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/terminal_text.hpp"
#include "common/utc_time.hpp"

namespace fedwan::cli {

using namespace fedwan::costs;  // the ledger, the bill and its checks
namespace {

using json = nlohmann::ordered_json;

// Records are untrusted input and this goes to a terminal.
std::string printable(const std::string& s) { return terminal_text(s); }

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

std::string refusal_text(const CostRefusal& r) {
  std::string who;
  if (!r.node.empty()) {
    who = printable(r.node) + (r.round ? " round " + std::to_string(*r.round) : "") + ": ";
  }
  return printable(r.origin) + ": " + who + printable(r.reason);
}

json verification_json(const CostFindings& f) {
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

json findings_json(const CostFindings& f) {
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

// What the bill rests on, in words, before the table.
void print_verification(std::ostream& out, const CostBill& bill, const CostFindings& f) {
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

}  // namespace

json bill_json(const CostBill& b, const std::string& window, const CostFindings& f) {
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

void print_bill(std::ostream& out, const CostBill& bill, const CostFindings& f) {
  print_verification(out, bill, f);
  print_table(out, bill.nodes, bill.totals, "total", bill.currency);
  for (const CostWindowBill& w : bill.windows) {
    out << "\nwindow " << utc_text(w.start) << " .. " << utc_text(w.end) << "\n";
    print_table(out, w.nodes, w.totals, "window total", bill.currency);
  }
}

}  // namespace fedwan::cli
