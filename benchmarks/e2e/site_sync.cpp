// Wall time of SiteCore::sync() at one site, driven from C++: the baseline
// that benchmarks/python/sync_overhead.py compares the Python bindings
// (fedwan.SiteCore, fedwan.Site) against in the same run.
//
// The harness writes the topology (one root, one site), provisions the
// credentials and starts two processes of this binary per run: the root
// (--root) and the site. The Python sides of the comparison join the same
// kind of root, so the root's work is the same for all of them.
//
// Site: joins as --node over a SiteCore on --params floats that start at
// the synthetic workload's initial model (the root's, so join() downloads
// nothing), then per round runs one synthetic local step, untimed, so the
// update is not zero, and times sync() alone.
// Root: serves node --node (the topology's root) from the same initial model.
//
// Usage: fedwan_site_sync --topology FILE --node ID --params N
//            (--credentials DIR | --insecure-plaintext) [--root] [--seed S]
//            [--join-timeout SECONDS] [--out FILE]
// Writes one JSON object (stdout, or --out FILE): the site's per-round sync
// times in seconds and bytes on the wire; the root's per-round reports.
// Exits 0 on success, 2 on bad arguments or a failed federation.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/security.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "fedwan/topology.hpp"

namespace {

struct Config {
  std::string topology;
  std::string node;
  std::string credentials;
  bool insecure_plaintext = false;
  bool root = false;
  uint64_t params = 0;
  uint64_t seed = 1;
  double join_timeout_s = 60;
  std::string out;  // empty: stdout
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "fedwan_site_sync: " << why << "\n"
            << "usage: fedwan_site_sync --topology FILE --node ID --params N\n"
            << "         (--credentials DIR | --insecure-plaintext) [--root] [--seed S]\n"
            << "         [--join-timeout SECONDS] [--out FILE]\n";
  std::exit(2);
}

fedwan::SecurityOptions security(const Config& cfg) {
  fedwan::SecurityOptions s;
  s.credentials_dir = cfg.credentials;
  s.insecure_plaintext = cfg.insecure_plaintext;
  return s;
}

template <class T>
std::string json_list(const std::vector<T>& v) {
  std::ostringstream out;
  out.precision(9);
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  out << "]";
  return out.str();
}

void emit(const Config& cfg, const std::string& json) {
  if (cfg.out.empty()) {
    std::cout << json << std::endl;
    return;
  }
  std::ofstream out(cfg.out);
  out << json << "\n";
  if (!out) throw fedwan::Error("cannot write " + cfg.out);
}

int serve_root(const Config& cfg, const fedwan::Topology& topo) {
  fedwan::AggregatorOptions o;
  o.topology = topo;
  o.node_id = cfg.node;
  o.initial_model = fedwan::synthetic::initial_model(cfg.params, cfg.seed);
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.join_timeout_s * 1000));
  o.security = security(cfg);
  const fedwan::AggregatorSummary s = fedwan::Aggregator(std::move(o)).run();
  std::vector<double> seconds;
  std::vector<uint64_t> wan_bytes;
  for (const fedwan::RoundReport& r : s.reports) {
    seconds.push_back(r.seconds);
    wan_bytes.push_back(r.wan_bytes);
  }
  std::ostringstream j;
  j << "{\"role\": \"root\", \"rounds\": " << s.rounds << ", \"security\": \"" << s.security_mode
    << "\", \"round_s\": " << json_list(seconds) << ", \"wan_bytes\": " << json_list(wan_bytes)
    << ", \"rejected_frames\": " << s.rejected_frames << "}";
  emit(cfg, j.str());
  return 0;
}

int run_site(const Config& cfg, const fedwan::Topology& topo) {
  using Clock = std::chrono::steady_clock;
  const uint32_t index = topo.node(cfg.node).index;
  std::vector<float> params = fedwan::synthetic::initial_model(cfg.params, cfg.seed);
  fedwan::SiteOptions o;
  o.topology = topo;
  o.node_id = cfg.node;
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.join_timeout_s * 1000));
  o.security = security(cfg);
  fedwan::SiteCore site(std::move(o), params.data(), params.size());

  const auto j0 = Clock::now();
  fedwan::SyncResult r = site.join();
  const double join_s = std::chrono::duration<double>(Clock::now() - j0).count();
  std::vector<double> sync_s;
  std::vector<uint64_t> sent, received;
  while (!r.finished) {
    // Local work stays out of the timing; the step makes the delta non-zero.
    fedwan::synthetic::local_steps(params.data(), params.size(), index, 1, cfg.seed);
    const auto t0 = Clock::now();
    r = site.sync();
    sync_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    sent.push_back(r.bytes_sent);
    received.push_back(r.bytes_received);
  }
  std::ostringstream j;
  j.precision(9);
  j << "{\"role\": \"site\", \"impl\": \"cpp\", \"params\": " << cfg.params << ", \"codec\": \""
    << topo.federation().codec << "\", \"join_s\": " << join_s
    << ", \"sync_s\": " << json_list(sync_s) << ", \"bytes_sent\": " << json_list(sent)
    << ", \"bytes_received\": " << json_list(received) << "}";
  emit(cfg, j.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--topology") {
      cfg.topology = value();
    } else if (a == "--node") {
      cfg.node = value();
    } else if (a == "--credentials") {
      cfg.credentials = value();
    } else if (a == "--insecure-plaintext") {
      cfg.insecure_plaintext = true;
    } else if (a == "--root") {
      cfg.root = true;
    } else if (a == "--params") {
      cfg.params = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--seed") {
      cfg.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--join-timeout") {
      cfg.join_timeout_s = std::atof(value().c_str());
    } else if (a == "--out") {
      cfg.out = value();
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (cfg.topology.empty() || cfg.node.empty()) usage("--topology and --node are required");
  if (cfg.params == 0) usage("--params must be positive");
  if (cfg.join_timeout_s <= 0) usage("--join-timeout must be positive");
  if (cfg.credentials.empty() == !cfg.insecure_plaintext) {
    usage("give exactly one of --credentials DIR and --insecure-plaintext");
  }
  try {
    const fedwan::Topology topo = fedwan::Topology::load(cfg.topology);
    return cfg.root ? serve_root(cfg, topo) : run_site(cfg, topo);
  } catch (const std::exception& e) {
    std::cerr << "fedwan_site_sync (" << cfg.node << "): " << e.what() << "\n";
    return 2;
  }
}
