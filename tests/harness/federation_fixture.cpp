#include "harness/federation_fixture.hpp"

#include <chrono>
#include <mutex>
#include <optional>
#include <utility>

#include "harness/node_spawner.hpp"

namespace fedwan::testing {

FederationRun run_threads(const Topology& topo, const std::vector<float>& init, uint64_t seed,
                          int window, const SiteSetup& setup) {
  FederationRun out;
  std::mutex mu;  // guards out.root and out.regions
  std::vector<const NodeSpec*> sites;
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role == Role::kSite) sites.push_back(&n);
  }
  out.site_models.resize(sites.size());
  out.site_bytes_sent.assign(sites.size(), 0);
  out.site_bytes_resent.assign(sites.size(), 0);
  out.site_replica_bytes.assign(sites.size(), 0);
  NodeSpawner nodes;
  for (const NodeSpec& n : topo.nodes()) {
    if (n.role == Role::kSite) continue;
    nodes.spawn(n.id, [&, id = n.id, is_root = n.role == Role::kRoot](NodeStopper& stopper) {
      AggregatorOptions o;
      o.topology = topo;
      o.node_id = id;
      o.join_timeout = std::chrono::seconds(15);
      o.window = window;
      o.security = security_for(topo, id);
      o.initial_model = is_root ? init : setup.region_initial_model;
      o.spill_from_bytes = 0;  // the anchor frames go through their file, as for a large model
      if (setup.aggregator) setup.aggregator(o);
      Aggregator agg(std::move(o));
      const auto bound = stopper.bind([&agg] { agg.stop(); });
      AggregatorSummary s = agg.run();
      std::lock_guard<std::mutex> lock(mu);
      if (is_root) {
        out.root = std::move(s);
      } else {
        out.regions.push_back(std::move(s));
      }
    });
  }
  for (size_t i = 0; i < sites.size(); ++i) {
    nodes.spawn(sites[i]->id, [&, i](NodeStopper& stopper) {
      const NodeSpec& n = *sites[i];
      std::vector<float> params = init;
      SiteOptions o;
      o.topology = topo;
      o.node_id = n.id;
      o.join_timeout = std::chrono::seconds(15);
      o.round_timeout = std::chrono::seconds(15);
      o.window = window;
      o.security = security_for(topo, n.id);
      if (setup.options) setup.options(o, i, params);
      SiteCore site(std::move(o), params.data(), params.size());
      const auto bound = stopper.bind([&site] { site.stop(); });
      if (setup.created) setup.created(site, i);
      SyncResult r = site.join();
      uint64_t sent = r.bytes_sent;
      uint64_t resent = r.bytes_resent;
      uint64_t replicas = r.replica_bytes;
      const uint64_t h = topo.federation().inner_steps;
      const uint64_t tau = topo.federation().overlap_steps;
      uint64_t done = 0;  // steps of the round taken while its anchor came
      while (!r.finished) {
        synthetic::local_steps(params.data(), params.size(), n.index, h - done, seed);
        if (tau == 0) {
          r = site.sync();
        } else {
          // Overlapped: tau more steps while the update goes up, except
          // after the last round's. Every other site merges through the
          // handle (waiting in short slices, as a trainer polling it would),
          // the others through finish_sync(): the same result either way.
          PendingSync pending = site.begin_sync();
          done = site.round() + 1 < site.rounds() ? tau : 0;
          synthetic::local_steps(params.data(), params.size(), n.index, done, seed);
          if (i % 2 == 1) {
            std::optional<SyncResult> got;
            while (!(got = pending.wait(std::chrono::milliseconds(5)))) {
            }
            r = *got;
          } else {
            r = site.finish_sync();
          }
          if (r.resynced) done = 0;
        }
        sent += r.bytes_sent;
        resent += r.bytes_resent;
        replicas += r.replica_bytes;
      }
      out.site_models[i] = params;
      out.site_bytes_sent[i] = sent;
      out.site_bytes_resent[i] = resent;
      out.site_replica_bytes[i] = replicas;
    });
  }
  nodes.join();
  out.errors = nodes.error_list();
  return out;
}

}  // namespace fedwan::testing
