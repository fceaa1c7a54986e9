// What `fedwan aggregator` and `fedwan site` share (node_common.hpp).
#include "cli/node_common.hpp"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "cli/validators.hpp"
#include "common/atomic_file.hpp"
#include "common/log_level.hpp"
#include "fedwan/aggregator.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"

namespace fedwan::cli {
namespace {

std::atomic<bool> g_terminate{false};
std::atomic<Aggregator*> g_aggregator{nullptr};
std::atomic<SiteCore*> g_site_core{nullptr};
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<Aggregator*>::is_always_lock_free);
static_assert(std::atomic<SiteCore*>::is_always_lock_free);

// A site in the middle of a sync may finish its round for this long (its
// local work is then checkpointed); joining, or a parent that does not
// answer, ends it sooner.
constexpr std::chrono::milliseconds kSyncGrace{5000};

extern "C" void on_terminate_signal(int) {
  g_terminate.store(true);
  if (Aggregator* a = g_aggregator.load()) a->stop();
  if (SiteCore* c = g_site_core.load()) c->stop(kSyncGrace);
}

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_terminate_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool terminate_requested() { return g_terminate.load(); }

AggregatorRegistration::AggregatorRegistration(Aggregator& a) {
  g_aggregator.store(&a);
  if (g_terminate.load()) a.stop();  // a signal that came while it was built
}

AggregatorRegistration::~AggregatorRegistration() { g_aggregator.store(nullptr); }

SiteCoreRegistration::SiteCoreRegistration(SiteCore* c) {
  g_site_core.store(c);
  // A signal that came before the site existed still stops it.
  if (c != nullptr && g_terminate.load()) c->stop(kSyncGrace);
}

SiteCoreRegistration::~SiteCoreRegistration() { g_site_core.store(nullptr); }

int stopped_by_signal(const std::string& node, uint64_t round, bool checkpointed) {
  log_always("warning", "fedwan: site '" + node + "' stopped by signal at round " +
                            std::to_string(round) +
                            (checkpointed ? "; it resumes from its last checkpoint" : ""));
  return 0;
}

void add_node_flags(CLI::App& cmd, NodeArgs& a) {
  cmd.add_option("--topology", a.topology, "topology YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd.add_option("--node", a.node, "this node's id in the topology")->required();
  cmd.add_option("--out", a.out, "write the final model here (raw little-endian fp32)");
  cmd.add_option("--join-timeout", a.join_timeout_s, "seconds to wait for the tree to form")
      ->check(number_in(0.1, 7 * 86400, /*integer=*/false))
      ->capture_default_str();
  cmd.add_option("--costs", a.costs,
                 "append this node's per-round cost records (JSON lines; `fedwan costs` bills "
                 "them) here; default <checkpoint-dir>/costs.jsonl, none without either");
  cmd.add_option("--metrics", a.metrics,
                 "serve Prometheus metrics (/metrics) and the JSON status (/status) over HTTP "
                 "at host:port (port 0: any free one); default the topology's `metrics` of "
                 "this node, none without it");
  cmd.add_option("--metrics-token-file", a.metrics_token_file,
                 "require `Authorization: Bearer <token>` on the metrics endpoint, the token "
                 "read from this file (owner-only, e.g. mode 0400; at least 16 characters)")
      ->check(CLI::ExistingFile);
  cmd.add_option("--metrics-linger", a.metrics_linger_s,
                 "after the node finished, keep serving its metrics this many seconds (so a "
                 "scraper gets the final values)")
      ->check(number_in(0, 3600, /*integer=*/false))
      ->capture_default_str();
  cmd.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "write a checkpoint here at every round boundary; resume from it on restart");
  add_security_flags(cmd, a.security);
  add_workload_flags(cmd, a.workload);
}

void linger_for_metrics(const NodeArgs& a) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(a.metrics_linger_s * 1000));
  while (std::chrono::steady_clock::now() < until && !g_terminate.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool wait_for_go(const NodeArgs& a) {
  if (a.join_after_file.empty()) return true;
  std::error_code ec;
  while (!std::filesystem::exists(a.join_after_file, ec) && !g_terminate.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!g_terminate.load()) return true;
  log_always("warning", "fedwan: site '" + a.node + "' stopped by signal before it joined");
  return false;
}

std::string costs_path(const NodeArgs& a) {
  if (!a.costs.empty() || a.checkpoint_dir.empty()) return a.costs;
  return (std::filesystem::path(a.checkpoint_dir) / "costs.jsonl").string();
}

SecurityOptions security_options(const SecurityArgs& s) {
  SecurityOptions o;
  o.credentials_dir = s.credentials;
  o.insecure_plaintext = s.insecure_plaintext;
  o.cipher = s.cipher;
  o.audit_log = s.audit_log;
  return o;
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= 10'000'000) {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  }
  return buf;
}

void print_alarms(const std::string& who, const std::vector<std::string>& alarms) {
  for (const std::string& a : alarms) log_always("error", "fedwan: " + who + " alarm: " + a);
}

void add_ca_flags(CLI::App& cmd, std::string& ca, std::string& crl, const std::string& ca_help,
                  const std::string& crl_help) {
  cmd.add_option("--ca", ca, ca_help)->check(CLI::ExistingFile);
  cmd.add_option("--crl", crl, crl_help)->check(CLI::ExistingFile);
}

void add_security_flags(CLI::App& cmd, SecurityArgs& s) {
  cmd.add_option("--credentials", s.credentials,
                 "this node's credentials bundle (DIR/<node-id> from `fedwan certs init`)")
      ->envname("FEDWAN_CREDENTIALS");
  cmd.add_flag("--insecure-plaintext", s.insecure_plaintext,
               "run links WITHOUT authentication or encryption (loopback experiments only; "
               "secure nodes refuse this node)");
  cmd.add_option("--cipher", s.cipher,
                 "frame cipher on the link to the parent: aes-256-gcm, "
                 "chacha20-poly1305")
      ->capture_default_str();
  cmd.add_option("--audit-log", s.audit_log, "append the hash-chained audit log to this file");
}

// 0600: a model trained on a site's data is as private as its checkpoints.
void write_model(const std::string& path, const float* data, size_t n) {
  write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(data), n * sizeof(float)),
                    0600);
}

std::vector<float> read_model(const std::string& path) {
  constexpr size_t kMaxModelValues = size_t{1} << 30;
  ReadFileOptions options;
  options.what = "model file";
  options.max_bytes = kMaxModelValues * sizeof(float);
  options.too_large_hint = "fedwan federates models of up to 2^30 parameters";
  const std::string bytes = read_file(path, options);
  if (bytes.empty() || bytes.size() % sizeof(float) != 0) {
    throw ConfigError("model file " + path + " holds " + std::to_string(bytes.size()) +
                      " bytes; a model is raw little-endian fp32 values (4 bytes each, at "
                      "least one), as `--out` writes it");
  }
  std::vector<float> model(bytes.size() / sizeof(float));
  std::memcpy(model.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < model.size(); ++i) {
    if (!std::isfinite(model[i])) {
      throw ConfigError("model file " + path + ": value " + std::to_string(i) +
                        " is not finite; a federation cannot start from it");
    }
  }
  return model;
}

void keep_freed_memory_for_reuse(uint64_t chunk_bytes) {
  // An operator's own GLIBC_TUNABLES win (mallopt would override them).
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return;
  // Above a chunk's buffers: twice its fp32 bytes, 2 MiB for the default
  // 1 MiB chunk.
  const uint64_t chunk = std::max<uint64_t>(chunk_bytes, uint64_t{1} << 20);
  const int mmap_threshold = static_cast<int>(std::min<uint64_t>(2 * chunk, uint64_t{1} << 30));
  // Above what a link's received frames swing by between chunks: at four
  // chunks glibc gave that back and every frame ZeroMQ received went into
  // pages faulted in again (docs/benchmarks.md, "Received frames in pages
  // kept").
  const int trim_threshold = static_cast<int>(std::min<uint64_t>(8 * chunk, uint64_t{1} << 30));
  ::mallopt(M_MMAP_THRESHOLD, mmap_threshold);
  ::mallopt(M_TRIM_THRESHOLD, trim_threshold);
}

int parse_and_run(CLI::App& app, int argc, const char* const* argv, const std::string& program,
                  const int& exit_code) {
  keep_freed_memory_for_reuse();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ConfigError& e) {
    std::cerr << program << ": configuration error: " << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << program << ": unexpected error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}

}  // namespace fedwan::cli
