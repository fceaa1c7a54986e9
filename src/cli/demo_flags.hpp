// The flags of `fedwan demo`, registered on its subcommand.
#pragma once

#include "cli/commands.hpp"

namespace fedwan::cli {

// Every flag of the demo, the workload's included, each bound to its field
// of `a` (which must outlive `cmd`'s parsing and callback).
void add_demo_flags(CLI::App& cmd, DemoArgs& a);

}  // namespace fedwan::cli
