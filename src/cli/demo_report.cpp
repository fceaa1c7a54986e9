// The demo's part of its report and its closing lines (demo_report.hpp).
#include "cli/demo_report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "costs/cost_bill.hpp"
#include "costs/cost_checks.hpp"
#include "costs/cost_ledger.hpp"
#include "fedwan/error.hpp"
#include "security/node_key.hpp"

namespace fedwan::cli {

using namespace fedwan::costs;  // the ledger, the bill and its checks

namespace fs = std::filesystem;

nlohmann::json demo_costs(const fs::path& dir, const Topology& topo, bool plaintext) {
  std::error_code ec;
  try {
    std::unique_ptr<security::SignatureVerifier> ca;
    CostTrust trust;
    trust.job = topo.job();
    if (plaintext) {
      trust.on_their_word = true;
    } else {
      ca = std::make_unique<security::SignatureVerifier>((dir / "pki" / "ca" / "ca.pem").string(),
                                                         (dir / "pki" / "ca" / "crl.pem").string());
      trust.ca = ca.get();
    }
    CostLedger ledger(trust);
    for (const auto& e : fs::recursive_directory_iterator(dir / "checkpoints", ec)) {
      if (e.path().filename() != "costs.jsonl") continue;
      std::ifstream f(e.path());
      ledger.read(f, e.path().string());
    }
    const CheckedCosts checked = check_costs(ledger, &topo);
    const CostBill bill = bill_costs(checked.billed, CostRates{}, 0);
    nlohmann::json nodes = nlohmann::json::object();
    for (const CostLine& l : bill.nodes) {
      nodes[l.node] = {{"role", l.role},
                       {"rounds", l.rounds},
                       {"rounds_contributed", l.contributed},
                       {"device_seconds", static_cast<double>(l.device_us_total) / 1e6},
                       {"bytes_sent", l.sent},
                       {"bytes_received", l.received}};
    }
    nlohmann::json refused = nlohmann::json::array();
    for (const CostRefusal& r : ledger.refusals()) refused.push_back(r.origin + ": " + r.reason);
    for (const CostRefusal& r : checked.refused) refused.push_back(r.origin + ": " + r.reason);
    nlohmann::json mismatched = nlohmann::json::array();
    for (const LinkReconciliation& l : checked.links) {
      if (l.mismatch) mismatched.push_back(l.child + "->" + l.parent);
    }
    return {{"records", bill.records},
            {"signed", !plaintext},
            {"refused", refused},
            {"link_mismatches", mismatched},
            {"nodes", nodes}};
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

nlohmann::json restarts_json(const std::vector<Restart>& restarts) {
  nlohmann::json out = nlohmann::json::array();
  for (const Restart& r : restarts) {
    nlohmann::json j = {
        {"node", r.node}, {"cause", r.cause}, {"number", r.number}, {"at_seconds", r.at_s}};
    j["died_in_round"] = r.died_in_round ? nlohmann::json(*r.died_in_round + 1) : nullptr;
    j["resumed_at_round"] = r.resumed_round ? nlohmann::json(*r.resumed_round + 1) : nullptr;
    j["rounds_lost"] =
        r.died_in_round && r.resumed_round
            ? nlohmann::json(*r.died_in_round - std::min(*r.died_in_round, *r.resumed_round))
            : nullptr;
    out.push_back(std::move(j));
  }
  return out;
}

void print_restarts(const std::vector<Restart>& restarts) {
  for (const Restart& r : restarts) {
    std::cout << "restart: " << r.node << " died (" << r.cause << ") "
              << (r.died_in_round ? "in round " + std::to_string(*r.died_in_round + 1)
                                  : std::string("before its first update"))
              << " at " << std::fixed << std::setprecision(1) << r.at_s << " s; "
              << (r.resumed_round
                      ? "resumed at round " + std::to_string(*r.resumed_round + 1) +
                            (r.died_in_round ? ", " +
                                                   std::to_string(*r.died_in_round -
                                                                  std::min(*r.died_in_round,
                                                                           *r.resumed_round)) +
                                                   " round(s) to redo"
                                             : std::string())
                      : std::string("rejoined"))
              << std::defaultfloat << std::endl;
  }
}

nlohmann::json demo_configuration(const DemoArgs& a, const Topology& topo, bool cuda,
                                  const fs::path& dir) {
  return {
      {"max_restarts", a.max_restarts},
      {"chaos", a.chaos.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.chaos)},
      {"sites", a.sites},
      {"regions", a.regions},
      {"rounds", a.rounds},
      {"inner_steps", a.inner_steps},
      {"overlap_steps", a.overlap_steps},
      {"streams", a.streams == kStreamsAuto ? nlohmann::json("auto") : nlohmann::json(a.streams)},
      {"codec", a.codec},
      {"outer_optimizer", a.outer},
      {"chunk_bytes", a.chunk_bytes},
      {"trainer", a.workload.trainer},
      {"seed", a.workload.seed},
      {"alpha", a.workload.alpha},
      {"batch_size", a.workload.batch_size},
      {"inner_optimizer", a.workload.inner_optimizer},
      {"lr", a.workload.lr},
      {"device", cuda ? "cuda" : "cpu"},
      {"topology_digest", topo.digest_hex()},
      {"security", a.insecure_plaintext ? std::string("plaintext") : "mtls/" + a.cipher},
      {"audit_dir", (dir / "audit").string()},
      // --node-binary: a run with a node another program played.
      {"node_binaries", a.node_binaries}};
}

void print_federation_summary(nlohmann::json& report, double federation_s, double wall_s) {
  const double ratio =
      report["fp32_bytes_total"].get<double>() > 0
          ? report["wan_bytes_total"].get<double>() / report["fp32_bytes_total"].get<double>()
          : 0.0;
  std::printf("federation: final accuracy %s, WAN %.2f MB (%.3f of fp32), %.1f s; total %.1f s\n",
              report.contains("final_accuracy")
                  ? std::to_string(report["final_accuracy"].get<double>()).c_str()
                  : "n/a",
              report["wan_bytes_total"].get<double>() / 1e6, ratio, federation_s, wall_s);
}

nlohmann::json cpu_json(const std::map<std::string, std::pair<double, double>>& cpu_seconds,
                        const fs::path& reports_dir,
                        const std::map<std::string, uint64_t>& minor_faults) {
  nlohmann::json nodes = nlohmann::json::object();
  double user = 0;
  double system = 0;
  std::optional<double> training;
  for (const auto& [id, t] : cpu_seconds) {
    nodes[id] = {{"user_s", t.first}, {"system_s", t.second}};
    if (const auto f = minor_faults.find(id); f != minor_faults.end()) {
      nodes[id]["minor_faults"] = f->second;
    }
    user += t.first;
    system += t.second;
    std::ifstream f(reports_dir / (id + ".json"));
    if (!f) continue;  // not a site, or one that wrote no report
    const nlohmann::json r = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (r.is_object() && r.contains("train_cpu_s_total") && r["train_cpu_s_total"].is_number()) {
      nodes[id]["training_s"] = r["train_cpu_s_total"];
      training = training.value_or(0) + r["train_cpu_s_total"].get<double>();
    }
  }
  nlohmann::json out = {{"nodes", nodes}, {"user_s", user}, {"system_s", system}};
  if (training) out["training_s"] = *training;
  return out;
}

void print_cpu(const nlohmann::json& cpu, double fp32_bytes) {
  const double user = cpu["user_s"].get<double>();
  const double system = cpu["system_s"].get<double>();
  if (user + system <= 0) return;
  std::printf(
      "cpu: nodes %.1f s user + %.1f s system; %.3f GB of fp32 model moved per CPU-second\n", user,
      system, fp32_bytes / 1e9 / (user + system));
  if (!cpu.contains("training_s")) return;
  const double training = cpu["training_s"].get<double>();
  const double federation = user + system - training;
  if (federation > 0) {
    std::printf("cpu: of which the sites' training %.1f s; the federation alone %.3f GB per "
                "CPU-second\n",
                training, fp32_bytes / 1e9 / federation);
  }
}

nlohmann::json memory_json(const std::map<std::string, uint64_t>& peak_rss_kib,
                           const std::map<std::string, uint64_t>& peak_anon_kib,
                           const Topology& topo, uint64_t parameters) {
  const double model_mib = static_cast<double>(parameters) * sizeof(float) / (1024.0 * 1024.0);
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& [id, kib] : peak_rss_kib) {
    const double mib = static_cast<double>(kib) / 1024.0;
    const NodeSpec* n = topo.find(id);  // a site a later version added: not in `topo`
    const std::string role = n != nullptr ? role_name(n->role) : "site";
    nodes[id] = {{"role", role},
                 {"peak_rss_mib", mib},
                 {"over_model", model_mib > 0 ? mib / model_mib : 0.0}};
    const auto anon = peak_anon_kib.find(id);
    if (anon != peak_anon_kib.end()) {
      nodes[id]["peak_anon_mib"] = static_cast<double>(anon->second) / 1024.0;
    }
  }
  return {{"parameters", parameters}, {"model_fp32_mib", model_mib}, {"nodes", nodes}};
}

namespace {

// Role -> the largest `key` of the nodes in that role that have it.
std::map<std::string, double> largest_by_role(const nlohmann::json& nodes, const char* key) {
  std::map<std::string, double> out;
  for (const auto& [id, n] : nodes.items()) {
    if (!n.contains(key)) continue;
    double& v = out[n["role"].get<std::string>()];
    v = std::max(v, n[key].get<double>());
  }
  return out;
}

// " root X MiB (Yx), largest region ..., largest site ...".
void print_roles(const std::map<std::string, double>& by_role, double model) {
  const char* sep = " ";
  for (const char* role : {"root", "region", "site"}) {
    const auto it = by_role.find(role);
    if (it == by_role.end()) continue;
    std::printf("%s%s%s %.0f MiB", sep, std::string(role) == "root" ? "" : "largest ", role,
                it->second);
    if (model > 0) std::printf(" (%.1fx)", it->second / model);
    sep = ", ";
  }
}

}  // namespace

void print_memory(const nlohmann::json& memory) {
  const nlohmann::json& nodes = memory["nodes"];
  if (nodes.empty()) return;
  const double model = memory["model_fp32_mib"].get<double>();
  const std::map<std::string, double> peak = largest_by_role(nodes, "peak_rss_mib");
  std::printf("memory: peak RSS");
  print_roles(peak, model);
  std::printf(" against the fp32 model's %.1f MiB\n", model);
  // Anonymous memory (sampled), where it differs: a node that maps a large
  // anchor from a file counts its resident pages in RSS.
  const std::map<std::string, double> anon = largest_by_role(nodes, "peak_anon_mib");
  bool differs = false;
  for (const auto& [role, a] : anon) differs = differs || peak.at(role) - a > 256.0;
  if (!differs) return;
  std::printf("memory: anonymous (sampled)");
  print_roles(anon, model);
  std::printf("; the rest of RSS is file pages the kernel may drop\n");
}

}  // namespace fedwan::cli
