// fedwan-aggregator: a root or region aggregator without LibTorch. The same
// flags as `fedwan aggregator` (docs/operations.md), on a program that
// loads none of LibTorch's libraries: an aggregator's memory is then its
// model's and its buffers', not ~170 MiB of LibTorch more, and its host
// needs no LibTorch installed. The model comes from --initial-model or the
// synthetic trainer; the fashion-cnn trainer and --eval need `fedwan
// aggregator`.
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/node_common.hpp"
#include "common/log_level.hpp"
#include "fedwan/config.h"

int main(int argc, char** argv) {
  using namespace fedwan;
  CLI::App app{"fedwan-aggregator " FEDWAN_VERSION_STRING
               " - a root or region aggregator (fedwan aggregator without LibTorch)"};
  app.set_version_flag("--version", FEDWAN_VERSION_STRING);
  std::string log_level, log_format;
  app.add_option("--log-level", log_level, "trace, debug, info, warn (default), error, off")
      ->envname("FEDWAN_LOG_LEVEL");
  app.add_option("--log-format", log_format, "text (default) or json (one object per line)")
      ->envname("FEDWAN_LOG_FORMAT");
  app.parse_complete_callback([&] {
    if (!log_level.empty()) set_log_level(log_level);
    if (!log_format.empty()) set_log_format(log_format);
  });
  int exit_code = 0;
  cli::NodeArgs args;
  cli::configure_aggregator(app, args, &exit_code, cli::AggregatorTorch{});
  // `fedwan-aggregator aggregator ...` reads as `fedwan aggregator ...`.
  if (argc > 1 && std::string(argv[1]) == "aggregator") {
    argv[1] = argv[0];
    return cli::parse_and_run(app, argc - 1, argv + 1, "fedwan-aggregator", exit_code);
  }
  return cli::parse_and_run(app, argc, argv, "fedwan-aggregator", exit_code);
}
