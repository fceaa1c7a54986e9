// The `fedwan` tool's command line: every subcommand, the global flags, and
// what an error becomes (a message on stderr and the exit code).

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/node_common.hpp"
#include "common/log_level.hpp"  // not log.hpp: no spdlog beside torch headers
#include "fedwan/config.h"

namespace fedwan::cli {

int run(int argc, char** argv) {
  CLI::App app{"fedwan " FEDWAN_VERSION_STRING " - cross-site federated training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", FEDWAN_VERSION_STRING);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn (default), error, off")
      ->envname("FEDWAN_LOG_LEVEL");
  std::string log_format;
  app.add_option("--log-format", log_format,
                 "text (default: time level [node round N] message) or json (one object per "
                 "line: time, level, node, round, msg)")
      ->envname("FEDWAN_LOG_FORMAT");

  int exit_code = 0;
  NodeArgs agg_args, site_args;
  DemoArgs demo_args;
  add_aggregator_command(app, agg_args, &exit_code, aggregator_torch());
  add_site_command(app, site_args, &exit_code);
  add_demo_command(app, demo_args, &exit_code);
  add_certs_command(app, &exit_code);
  add_audit_command(app, &exit_code);
  add_checkpoint_command(app, &exit_code);
  add_bench_command(app, &exit_code);
  add_costs_command(app, &exit_code);
  add_status_command(app, &exit_code);
  add_topology_command(app, &exit_code);
  app.parse_complete_callback([&] {
    if (!log_level.empty()) set_log_level(log_level);
    if (!log_format.empty()) set_log_format(log_format);
  });

  return parse_and_run(app, argc, argv, "fedwan", exit_code);
}

}  // namespace fedwan::cli
