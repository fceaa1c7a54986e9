// How the demo starts a node: the `fedwan site` / `fedwan aggregator`
// command line of each of its ranks, where they log, audit and checkpoint,
// and when a late or added site joins (see NodeLaunch).
#pragma once

#include <string>

#include "cli/commands.hpp"
#include "cli/demo_plan.hpp"
#include "cli/demo_supervisor.hpp"
#include "fedwan/topology.hpp"

namespace fedwan::cli {

// Node `n` of the plan, reading `topology_file` (the added site reads its
// own version). Removes the node's go file an earlier run may have left.
NodeLaunch demo_node_launch(const DemoArgs& a, const DemoPlan& plan, const NodeSpec& n,
                            const std::string& topology_file);

// fedwan-aggregator beside this program ("" when it is not there): a
// synthetic run's aggregators need no LibTorch, and without it their memory
// is their model's and their buffers'.
std::string torch_free_aggregator();

}  // namespace fedwan::cli
