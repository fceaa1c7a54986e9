// Peak memory of a region aggregator as its number of sites grows.
//
// Claim under test: a region aggregator holds one fp32 accumulator per chunk
// in flight, one error-feedback residual and one anchor copy (to resync
// children that rejoin) of the model size, never one copy per child, so its
// peak RSS for a given model does not grow with the
// number of sites beyond what the socket windows let queue (window frames
// per child and direction).
//
// For each site count K the driver writes a topology root -> region-0 -> K
// sites over ipc:// endpoints, starts the region as a separate process (this
// binary, hidden mode --serve-region) so that its VmHWM covers nothing but
// the aggregator, and runs the root and the K sites as threads of its own.
// The region reports its RSS after construction (idle) and its peak RSS at
// the end. The smallest K is the baseline; growth to larger K is compared
// with the socket-window bound and with a design that buffered every child's
// full delta (K x model).
//
// Usage: fedwan_aggregator_memory [--params N] [--sites 2,8] [--rounds R]
//            [--chunk-bytes B] [--window W] [--peer-window W] [--repeat N]
//            [--codec fp16|bf16|int8|fp32] [--json FILE]
// Prints a table and PASS (exit 0) or FAIL (exit 1); exit 2 on errors.
// --json FILE also writes the table's rows and the verdict there, as one
// JSON object ("format": "fedwan.aggregator_memory", "version": 1), which
// `fedwan_results.load` reads.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/security.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "fedwan/topology.hpp"

extern char** environ;

namespace {

using fedwan::Role;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr uint64_t kSeed = 11;
// RSS noise that is not queued data: allocator rounding, page-granular
// growth of the heap, ZeroMQ's per-connection buffers (8 KiB batches, pipes).
constexpr double kSlackMiB = 8.0;

struct Config {
  uint64_t params = 10'000'000;
  std::vector<int> sites = {2, 8};
  uint64_t rounds = 3;
  uint64_t chunk_bytes = 1 << 20;
  int window = 8;
  int peer_window = 0;  // root and sites; 0: the same as `window`
  std::string codec = "fp16";
  // --rule: the region's own aggregation rule (its `aggregation` key); a
  // buffered rule holds every child's decoded copy of a chunk until it
  // closes. "": the default, streamed weighted mean.
  std::string rule;
  int repeat = 3;    // runs per site count
  std::string json;  // --json: where to write the rows; empty: nowhere
};

// A field of /proc/self/status in KiB (VmRSS, VmHWM, ...); -1 if absent.
long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtol(line.c_str() + n + 1, nullptr, 10);
    }
  }
  return -1;
}

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "fedwan_aggregator_memory: " << why << "\n"
            << "usage: fedwan_aggregator_memory [--params N] [--sites 2,8] [--rounds R]\n"
            << "         [--chunk-bytes B] [--window W] [--peer-window W] [--repeat N]\n"
            << "         [--codec fp16|bf16|int8|fp32] [--rule NAME] [--json FILE]\n";
  std::exit(2);
}

std::vector<int> parse_sites(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int k = std::atoi(item.c_str());
    // With one child every chunk completes on arrival, so a one-site region
    // never holds more than one accumulator; from two children on it may
    // hold up to a model's worth, whatever their number. A one-site
    // baseline would charge that step to the site count.
    if (k < 2) usage("--sites takes a comma-separated list of counts of at least 2");
    out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.size() < 2) usage("--sites needs at least two different counts to compare");
  return out;
}

// ---- the region process ------------------------------------------------------

// Runs node "region-0" of the topology file and writes its memory figures
// (KiB) to `report` as key=value lines. Returns the exit status.
int serve_region(const std::string& topology_path, const std::string& report, int window) {
  try {
    fedwan::AggregatorOptions o;
    o.topology = fedwan::Topology::load(topology_path);
    o.node_id = "region-0";
    o.join_timeout = std::chrono::seconds(60);
    o.window = window;
    // Credentials sit next to the topology file (see measure()).
    o.security = fedwan::credentials_in(
        (std::filesystem::path(topology_path).parent_path() / "pki").string(), "region-0");
    fedwan::Aggregator agg(std::move(o));
    const long idle_rss = status_kib("VmRSS");
    const auto t0 = std::chrono::steady_clock::now();
    const fedwan::AggregatorSummary s = agg.run();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream out(report);
    out << "idle_rss_kib=" << idle_rss << "\n"
        << "peak_rss_kib=" << status_kib("VmHWM") << "\n"
        << "end_rss_kib=" << status_kib("VmRSS") << "\n"
        << "rounds=" << s.rounds << "\n"
        << "rejected=" << s.rejected_frames << "\n"
        << "seconds=" << secs << "\n";
    return out ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "region-0: " << e.what() << "\n";
    return 1;
  }
}

// ---- the driver ----------------------------------------------------------------

struct Measurement {
  int sites = 0;
  double idle_mib = 0, peak_mib = 0;
  double seconds = 0;  // the whole federation, as the driver saw it
};

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fedwan-aggmem-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw fedwan::Error("cannot create a temporary directory");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

fedwan::Topology make_topology(const std::filesystem::path& dir, int sites, const Config& cfg) {
  auto endpoint = [&](const std::string& id) { return "ipc://" + (dir / (id + ".sock")).string(); };
  std::vector<fedwan::NodeSpec> nodes;
  fedwan::NodeSpec root;
  root.id = "root";
  root.role = Role::kRoot;
  root.endpoint = endpoint(root.id);
  nodes.push_back(root);
  fedwan::NodeSpec region;
  region.id = "region-0";
  region.role = Role::kRegion;
  region.parent = root.id;
  region.endpoint = endpoint(region.id);
  if (!cfg.rule.empty()) {
    region.aggregation = fedwan::AggregationSpec{};
    region.aggregation->rule = cfg.rule;
  }
  nodes.push_back(region);
  for (int s = 0; s < sites; ++s) {
    fedwan::NodeSpec n;
    n.id = "site-" + std::to_string(s);
    n.role = Role::kSite;
    n.parent = region.id;
    n.weight = 1.0 + s;
    nodes.push_back(n);
  }
  fedwan::FederationSpec fed;
  fed.rounds = cfg.rounds;
  fed.inner_steps = 1;  // local training is not what is measured; keep it cheap
  fed.codec = cfg.codec;
  fed.chunk_bytes = cfg.chunk_bytes;
  fed.round_timeout_s = 60;
  return fedwan::Topology::build("aggregator-memory", fed, nodes);
}

std::map<std::string, double> read_report(const std::filesystem::path& path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = std::atof(line.c_str() + eq + 1);
  }
  return out;
}

pid_t spawn_region(const std::filesystem::path& topology, const std::filesystem::path& report,
                   int window) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) throw fedwan::Error("cannot resolve /proc/self/exe");
  exe[len] = '\0';
  std::vector<std::string> args = {
      exe,        "--serve-region",      topology.string(), "--report", report.string(),
      "--window", std::to_string(window)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw fedwan::Error(std::string("cannot start the region process: ") + strerror(rc));
  return pid;
}

// One federation with `sites` sites; the region runs in its own process.
Measurement measure(int sites, const Config& cfg, const std::vector<float>& init) {
  ScratchDir dir;
  const std::filesystem::path topo_path = dir.path() / "topology.yaml";
  const std::filesystem::path report_path = dir.path() / "region.report";
  {
    std::ofstream out(topo_path);
    out << make_topology(dir.path(), sites, cfg).to_yaml();
    if (!out) throw fedwan::Error("cannot write " + topo_path.string());
  }
  // Every node loads the same file, so all agree on the topology digest.
  const fedwan::Topology topo = fedwan::Topology::load(topo_path.string());
  // Links are mutual TLS + AES-256-GCM, as in a deployment.
  const std::string pki = (dir.path() / "pki").string();
  fedwan::provision_credentials(topo, pki);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t region = spawn_region(topo_path, report_path, cfg.window);

  std::mutex mu;
  std::vector<std::string> errors;
  auto fail = [&](const std::string& who, const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(who + ": " + e.what());
  };
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    try {
      fedwan::AggregatorOptions o;
      o.topology = topo;
      o.node_id = "root";
      o.initial_model = init;
      o.join_timeout = std::chrono::seconds(60);
      o.window = cfg.peer_window;
      o.security = fedwan::credentials_in(pki, "root");
      fedwan::Aggregator(std::move(o)).run();
    } catch (const std::exception& e) {
      fail("root", e);
    }
  });
  for (const fedwan::NodeSpec& n : topo.nodes()) {
    if (n.role != Role::kSite) continue;
    threads.emplace_back([&, id = n.id, index = n.index] {
      try {
        std::vector<float> params = init;
        fedwan::SiteOptions o;
        o.topology = topo;
        o.node_id = id;
        o.join_timeout = std::chrono::seconds(60);
        o.window = cfg.peer_window;
        o.security = fedwan::credentials_in(pki, id);
        fedwan::SiteCore site(std::move(o), params.data(), params.size());
        fedwan::SyncResult r = site.join();
        while (!r.finished) {
          fedwan::synthetic::local_steps(params.data(), params.size(), index, 1, kSeed);
          r = site.sync();
        }
      } catch (const std::exception& e) {
        fail(id, e);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (!errors.empty()) kill(region, SIGTERM);  // it would otherwise wait out its timeouts
  int status = 0;
  waitpid(region, &status, 0);
  Measurement m;
  m.sites = sites;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!errors.empty()) {
    std::string all;
    for (const std::string& e : errors) all += "\n  " + e;
    throw fedwan::Error("federation with " + std::to_string(sites) + " sites failed:" + all);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw fedwan::Error("the region process failed (status " + std::to_string(status) + ")");
  }
  const auto rep = read_report(report_path);
  if (!rep.count("peak_rss_kib") || rep.at("rounds") != double(cfg.rounds)) {
    throw fedwan::Error("the region process did not report a complete run");
  }
  if (rep.at("rejected") != 0) {
    throw fedwan::Error("the region rejected " + std::to_string(rep.at("rejected")) +
                        " frames; the run does not show a clean federation");
  }
  m.idle_mib = rep.at("idle_rss_kib") / 1024.0;
  m.peak_mib = rep.at("peak_rss_kib") / 1024.0;
  return m;
}

// One site count of the sweep, in MiB. The figures after `seconds` compare it
// with the baseline (the smallest site count); the verdict's are unset there.
struct SiteCountResult {
  int sites = 0;
  double idle_mib = 0, peak_min = 0, peak_max = 0, seconds = 0;
  double growth = 0, growth_chunks = 0, growth_models = 0, every_delta = 0;
  double window_bound = 0, extra_deltas = 0, growth_share = 0;
  bool ok = true;
};

// The --json file: the configuration, every row of the table and the verdict
// (keys in the order of the table, so that the file reads like it).
void write_json(const std::string& path, const Config& cfg, uint64_t chunks, double model_mib,
                const std::vector<SiteCountResult>& rows, bool pass) {
  nlohmann::ordered_json out_rows = nlohmann::ordered_json::array();
  for (const SiteCountResult& r : rows) {
    const bool base = r.sites == rows.front().sites;
    auto unless_base = [&](auto v) {
      return base ? nlohmann::ordered_json() : nlohmann::ordered_json(v);
    };
    out_rows.push_back({{"sites", r.sites},
                        {"idle_mib", r.idle_mib},
                        {"peak_min_mib", r.peak_min},
                        {"peak_max_mib", r.peak_max},
                        {"seconds", r.seconds},
                        {"growth_mib", r.growth},
                        {"growth_chunks", r.growth_chunks},
                        {"growth_models", r.growth_models},
                        {"every_delta_mib", r.every_delta},
                        {"window_bound_mib", unless_base(r.window_bound)},
                        {"extra_deltas_mib", unless_base(r.extra_deltas)},
                        {"growth_share", unless_base(r.growth_share)},
                        {"ok", unless_base(r.ok)}});
  }
  const nlohmann::ordered_json j = {{"format", "fedwan.aggregator_memory"},
                                    {"version", 1},
                                    {"config",
                                     {{"params", cfg.params},
                                      {"codec", cfg.codec},
                                      {"rule", cfg.rule.empty() ? "weighted_mean" : cfg.rule},
                                      {"chunk_bytes", cfg.chunk_bytes},
                                      {"chunks", chunks},
                                      {"rounds", cfg.rounds},
                                      {"window", cfg.window},
                                      {"peer_window", cfg.peer_window},
                                      {"repeat", cfg.repeat},
                                      {"model_mib", model_mib}}},
                                    {"baseline_sites", rows.front().sites},
                                    {"pass", pass},
                                    {"rows", out_rows}};
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw fedwan::Error("cannot write " + path);
}

int drive(Config cfg) {
  // Every node uses the same window unless --peer-window says otherwise
  // (the root and the sites live in this process; only the region, a
  // process of its own, is measured).
  const uint64_t chunks = (cfg.params * sizeof(float) + cfg.chunk_bytes - 1) / cfg.chunk_bytes;
  if (cfg.peer_window <= 0) cfg.peer_window = cfg.window;
  const double model_mib = double(cfg.params) * sizeof(float) / kMiB;
  const double chunk_mib = double(cfg.chunk_bytes) / kMiB;
  const std::string rule = cfg.rule.empty() ? "weighted_mean" : cfg.rule;
  // Every rule but the weighted mean buffers (median, trimmed_mean,
  // multi_krum); an unknown one stops the first run (the topology's check).
  const bool buffered = rule != "weighted_mean";
  std::printf("region aggregator memory: %llu parameters (%.1f MiB fp32), codec %s, %llu chunks "
              "of %.2f MiB, region window %d (root and sites %d), %llu rounds, %d runs per "
              "site count, rule %s (%s)\n",
              static_cast<unsigned long long>(cfg.params), model_mib, cfg.codec.c_str(),
              static_cast<unsigned long long>(chunks), chunk_mib, cfg.window, cfg.peer_window,
              static_cast<unsigned long long>(cfg.rounds), cfg.repeat, rule.c_str(),
              buffered ? "buffered" : "streaming");
  std::fflush(stdout);
  const std::vector<float> init = fedwan::synthetic::initial_model(cfg.params, kSeed);

  // How many chunks a region holds accumulators for depends on how far its
  // fastest child runs ahead of its slowest, which varies from run to run;
  // the worst of several runs is what a deployment must provision for.
  std::vector<SiteCountResult> rows;
  for (int k : cfg.sites) {
    SiteCountResult row;
    row.sites = k;
    for (int r = 0; r < cfg.repeat; ++r) {
      const Measurement m = measure(k, cfg, init);
      row.idle_mib = std::max(row.idle_mib, m.idle_mib);
      row.peak_min = r == 0 ? m.peak_mib : std::min(row.peak_min, m.peak_mib);
      row.peak_max = std::max(row.peak_max, m.peak_mib);
      row.seconds += m.seconds;
    }
    std::printf("  %d sites: %d runs in %.1f s\n", k, cfg.repeat, row.seconds);
    std::fflush(stdout);
    rows.push_back(row);
  }

  const SiteCountResult base = rows.front();
  for (SiteCountResult& r : rows) {
    const int extra = r.sites - base.sites;
    r.growth = r.peak_max - base.peak_max;
    r.growth_chunks = r.growth / chunk_mib;
    r.growth_models = r.growth / model_mib;
    r.every_delta = r.sites * model_mib;
    // Each extra child may hold `window` frames of at most one chunk queued
    // in each direction; that is all that may grow with the site count
    // under a streaming rule. A buffered rule also holds each extra child's
    // decoded copy of every chunk in flight: at most a model's worth each
    // (docs/architecture.md states fan-in x chunk x chunks in flight).
    r.window_bound = extra * cfg.window * chunk_mib * 2 + kSlackMiB;
    r.extra_deltas = extra * model_mib;
    r.growth_share = extra > 0 ? r.growth / r.extra_deltas : 0;
    r.ok =
        extra == 0 || (buffered ? r.growth <= r.window_bound + r.extra_deltas
                                : r.growth <= r.window_bound && r.growth <= 0.5 * r.extra_deltas);
  }
  std::printf("\n%5s %9s %9s %15s %11s %10s %10s %13s\n", "sites", "model MiB", "idle MiB",
              "peak MiB", "growth MiB", "in chunks", "in models", "K x model MiB");
  for (const SiteCountResult& r : rows) {
    char peak[32];
    std::snprintf(peak, sizeof(peak), "%.1f..%.1f", r.peak_min, r.peak_max);
    std::printf("%5d %9.1f %9.1f %15s %11.1f %10.1f %10.2f %13.1f\n", r.sites, model_mib,
                r.idle_mib, peak, r.growth, r.growth_chunks, r.growth_models, r.every_delta);
  }
  std::printf("(peak: VmHWM of the region process, lowest..highest of the runs; growth: highest "
              "peak minus the %d-site one; K x model: what buffering every child's full fp32 "
              "delta would take)\n",
              base.sites);
  std::printf("a region holds: idle + one error-feedback residual of the model (lossy codecs) "
              "+ one fp32 copy of the anchor (to resync children) + one %.2f MiB accumulator per "
              "chunk in flight (up to %llu, as far as its "
              "fastest child runs ahead) + per child up to %d frames queued each way\n\n",
              chunk_mib, static_cast<unsigned long long>(chunks), cfg.window);
  bool pass = true;
  for (size_t i = 1; i < rows.size(); ++i) {
    const SiteCountResult& r = rows[i];
    const int extra = r.sites - base.sites;
    pass = pass && r.ok;
    std::printf("%d -> %d sites: peak grew %.1f MiB (%.2f MiB per extra site, %.1f chunks); "
                "window bound %.1f MiB%s; %d more full deltas would be %.1f MiB, growth is "
                "%.1f%% of that: %s\n",
                base.sites, r.sites, r.growth, r.growth / extra, r.growth / extra / chunk_mib,
                r.window_bound, buffered ? " + one fp32 copy per extra child of every chunk" : "",
                extra, r.extra_deltas, 100.0 * r.growth_share, r.ok ? "ok" : "too much");
  }
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  if (!cfg.json.empty()) write_json(cfg.json, cfg, chunks, model_mib, rows, pass);
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  std::string serve_topology, report;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--params") {
      cfg.params = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--sites") {
      cfg.sites = parse_sites(value());
    } else if (a == "--rounds") {
      cfg.rounds = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--chunk-bytes") {
      cfg.chunk_bytes = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--rule") {
      cfg.rule = value();
    } else if (a == "--window") {
      cfg.window = std::atoi(value().c_str());
    } else if (a == "--peer-window") {
      cfg.peer_window = std::atoi(value().c_str());
    } else if (a == "--repeat") {
      cfg.repeat = std::atoi(value().c_str());
    } else if (a == "--codec") {
      cfg.codec = value();
    } else if (a == "--json") {
      cfg.json = value();
    } else if (a == "--serve-region") {  // internal: the measured process
      serve_topology = value();
    } else if (a == "--report") {
      report = value();
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (!serve_topology.empty()) return serve_region(serve_topology, report, cfg.window);
  if (cfg.params == 0 || cfg.rounds == 0 || cfg.window < 1 || cfg.repeat < 1) {
    usage("--params, --rounds, --window and --repeat must be positive");
  }
  try {
    return drive(cfg);
  } catch (const std::exception& e) {
    std::cerr << "fedwan_aggregator_memory: " << e.what() << "\n";
    return 2;
  }
}
