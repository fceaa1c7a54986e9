// What a `fedwan demo` run is made of, prepared in its working directory
// before any node starts: the topology on loopback ports, the federation's
// credentials, and the parsed --late, --leave, --chaos and --add-site plans.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "cli/demo_supervisor.hpp"
#include "cli/demo_versions.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::cli {

struct DemoPlan {
  std::filesystem::path dir;  // the working directory (--dir, or a fresh one)
  std::filesystem::path pki;  // <dir>/pki: the federation CA and one bundle per node
  Topology topology;          // as the demo starts (version 1)
  std::string topology_file;  // <dir>/topology.yaml, the one every node reads
  std::string root_report;    // <dir>/root.json, the root's --report
  std::optional<SiteRound> late, leave;
  std::optional<ChaosPlan> chaos;
  std::optional<AddedSite> added;  // --add-site: version 2's site
  // --node-binary: node id -> the program it runs instead of this one.
  std::map<std::string, std::string> binaries;
};

// Builds the demo's topology and writes it into `dir`, provisions (or
// reuses) its credentials unless --insecure-plaintext, prepares the added
// site, and clears what an earlier run in `dir` left that nodes would take
// for their own (rendezvous addresses, checkpoints). Throws ConfigError for
// flags that do not fit together.
DemoPlan plan_demo(const DemoArgs& a, std::filesystem::path dir);

}  // namespace fedwan::cli
