#include "harness/node_threads.hpp"

#include <chrono>
#include <fstream>
#include <utility>

#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"

namespace fedwan::testing {

void spawn_aggregator(NodeSpawner& nodes, const Topology& topo, const std::string& id,
                      const std::vector<float>& init, AggregatorSummary* summary,
                      std::function<void(AggregatorOptions&)> adjust) {
  nodes.spawn(id, [&topo, id, init, summary, adjust](NodeStopper& stopper) {
    AggregatorOptions o;
    o.topology = topo;
    o.node_id = id;
    if (topo.node(id).role == Role::kRoot) o.initial_model = init;
    o.join_timeout = std::chrono::seconds(60);
    o.security = security_for(topo, id);
    o.spill_from_bytes = 0;  // the anchor frames go through their file, as for a large model
    if (adjust) adjust(o);
    Aggregator aggregator(std::move(o));
    const auto bound = stopper.bind([&aggregator] { aggregator.stop(); });
    AggregatorSummary s = aggregator.run();
    if (summary != nullptr) *summary = std::move(s);
  });
}

void spawn_synthetic_site(NodeSpawner& nodes, const Topology& topo, const std::string& id,
                          const std::vector<float>& init, uint64_t seed, uint64_t steps) {
  nodes.spawn(id, [&topo, id, init, seed, steps](NodeStopper& stopper) {
    std::vector<float> params = init;
    SiteCore site(site_options(topo, id, std::chrono::seconds(60)), params.data(), params.size());
    const auto bound = stopper.bind([&site] { site.stop(); });
    SyncResult r = site.join();
    while (!r.finished) {
      synthetic::local_steps(params.data(), params.size(), topo.node(id).index, steps, seed);
      r = site.sync();
    }
  });
}

std::vector<nlohmann::json> audit_entries(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return out;
}

size_t count_audit(const std::filesystem::path& path, const std::string& event,
                   const std::string& needle) {
  size_t n = 0;
  for (const nlohmann::json& e : audit_entries(path)) {
    if (e.is_object() && e["event"] == event &&
        e["fields"].dump().find(needle) != std::string::npos) {
      ++n;
    }
  }
  return n;
}

bool has_alarm(const std::vector<std::string>& alarms, const std::string& kind) {
  for (const std::string& a : alarms) {
    if (a.rfind(kind + ":", 0) == 0) return true;
  }
  return false;
}

}  // namespace fedwan::testing
