// The demo's side of its JSON report (the root's, completed): every node's
// bill from its cost records, the restarts and what they cost, the run's
// configuration, and the lines the demo prints about them at the end.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/demo_supervisor.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::cli {

// What every node's cost records add up to, as `fedwan costs` bills them:
// per node, its rounds, device-seconds and bytes sent and received, each
// record checked against the demo's CA (unsigned with --insecure-plaintext)
// and the topology. Never throws: a failure is the object's "error".
nlohmann::json demo_costs(const std::filesystem::path& dir, const Topology& topo, bool plaintext);

// Rounds 1-based, as the demo prints them.
nlohmann::json restarts_json(const std::vector<Restart>& restarts);

// One line per restart on stdout: when the node died and the rounds it had
// to redo.
void print_restarts(const std::vector<Restart>& restarts);

// The flags the run used, and what they resolved to: where the sites
// trained (`cuda`), the topology's digest and the audit logs' directory.
nlohmann::json demo_configuration(const DemoArgs& a, const Topology& topo, bool cuda,
                                  const std::filesystem::path& dir);

// {"nodes": {id: {"user_s", "system_s"}}, "user_s", "system_s"}: the CPU
// time of every node (not the demo's own), and their sum; with
// "training_s" where the sites' reports in `reports_dir` (<site>.json)
// give their training's CPU time (the synthetic trainer): the part of the
// sum that was training, not federation (of a site's last start: a
// restarted site's report is its last process's).
// Each node's entry has its "minor_faults" too, where `minor_faults` has
// it (DemoSupervisor::minor_faults).
nlohmann::json cpu_json(const std::map<std::string, std::pair<double, double>>& cpu_seconds,
                        const std::filesystem::path& reports_dir,
                        const std::map<std::string, uint64_t>& minor_faults = {});
void print_cpu(const nlohmann::json& cpu, double fp32_bytes);

// Each node's peak resident memory (`peak_rss_kib`, from the supervisor)
// in MiB, and against the fp32 model of `parameters`: the report's
// "memory" object.
nlohmann::json memory_json(const std::map<std::string, uint64_t>& peak_rss_kib,
                           const std::map<std::string, uint64_t>& peak_anon_kib,
                           const Topology& topo, uint64_t parameters);
// One line on stdout: the root's peak, the largest region's and site's.
void print_memory(const nlohmann::json& memory);

// The closing line on stdout: the federation's accuracy and WAN bytes from
// the root's `report`, and the run's times in seconds. Not const: a total
// missing from the report reads as null (nlohmann's operator[] adds it) and
// throws nlohmann::json::type_error rather than asserting.
void print_federation_summary(nlohmann::json& report, double federation_s, double wall_s);

}  // namespace fedwan::cli
