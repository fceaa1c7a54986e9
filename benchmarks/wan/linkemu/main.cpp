// fedwan-linkemu: emulated WAN links between network namespaces, for the
// benchmark harness (`fedwan bench`) on kernels without netem. See
// emulator.hpp for the model and docs/benchmarks.md for the file format.
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "emulator.hpp"
#include "tun_netns.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "fedwan-linkemu - forwards IP packets between TUN devices in network namespaces with each "
      "link's delay, jitter, rate, loss, duplication and reordering"};
  std::string config_path, stats_path;
  bool check_only = false;
  app.add_option("--config", config_path, "links and hosts (JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--stats", stats_path,
                 "write per-link counters here (JSON) on SIGUSR1 and when stopped");
  app.add_flag("--check", check_only, "validate the configuration, print it, and exit");
  CLI11_PARSE(app, argc, argv);

  using fedwan::linkemu::config_from_json;
  try {
    std::ifstream in(config_path);
    const fedwan::linkemu::EmulatorConfig config = config_from_json(nlohmann::json::parse(in));
    if (check_only) {
      for (const auto& l : config.links) {
        std::cout << l.a << " -> " << l.b << ": "
                  << fedwan::linkemu::profile_to_json(l.a_to_b).dump() << "\n"
                  << l.b << " -> " << l.a << ": "
                  << fedwan::linkemu::profile_to_json(l.b_to_a).dump() << "\n";
      }
      return 0;
    }
    const std::string why = fedwan::linkemu::tun_unavailable_reason();
    if (!why.empty()) {
      std::cerr << "fedwan-linkemu: " << why << "\n";
      return 77;
    }
    fedwan::linkemu::Emulator emulator(config);
    std::cout << "ready" << std::endl;
    emulator.run(stats_path);
  } catch (const nlohmann::json::exception& e) {
    std::cerr << "fedwan-linkemu: " << config_path << ": " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "fedwan-linkemu: " << config_path << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "fedwan-linkemu: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
