// The flags of `fedwan demo` (DemoArgs in cli/commands.hpp), in the order
// its help lists them.
#include "cli/demo_flags.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>

#include "aggregation/aggregation_rule.hpp"
#include "cli/validators.hpp"
#include "fedwan/error.hpp"
#include "topology/aggregation_settings.hpp"
#include "topology/privacy_settings.hpp"

namespace fedwan::cli {
namespace {

double number_value(const std::string& key, const std::string& v,
                    const char* flag = "--aggregation") {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(d)) {
    throw ConfigError(std::string(flag) + " " + key + "=" + v + ": not a number");
  }
  return d;
}

uint64_t count_value(const std::string& key, const std::string& v, const char* flag) {
  const double d = number_value(key, v, flag);
  if (d < 0 || d > 1e9 || d != std::floor(d)) {
    throw ConfigError(std::string(flag) + " " + key + "=" + v + ": not a whole number");
  }
  return static_cast<uint64_t>(d);
}

bool flag_value(const std::string& key, const std::string& v, const char* flag) {
  if (v == "true" || v == "on") return true;
  if (v == "false" || v == "off") return false;
  throw ConfigError(std::string(flag) + " " + key + "=" + v + ": use true or false");
}

// One KEY=VALUE of an --aggregation flag; params.NAME sets a rule parameter.
void set_aggregation(AggregationSpec& a, const std::string& key, const std::string& v,
                     const char* flag) {
  NormBoundSpec& b = a.norm_bound;
  if (key == "rule")
    a.rule = v;
  else if (key.rfind("params.", 0) == 0 && key.size() > 7)
    a.params[key.substr(7)] = number_value(key, v, flag);
  else if (key == "finite_check")
    a.finite_check = flag_value(key, v, flag);
  else if (key == "max_abs")
    a.max_abs = number_value(key, v, flag);
  else if (key == "replay_window")
    a.replay_window = count_value(key, v, flag);
  else if (key == "norm_bound.mode")
    b.mode = v;
  else if (key == "norm_bound.factor")
    b.factor = number_value(key, v, flag);
  else if (key == "norm_bound.window")
    b.window = count_value(key, v, flag);
  else if (key == "norm_bound.bound")
    b.bound = number_value(key, v, flag);
  else if (key == "norm_bound.action")
    b.action = v;
  else
    throw ConfigError(std::string(flag) + ": unknown key '" + key + "'");
}

void set_privacy(PrivacySpec& p, const std::string& key, const std::string& v) {
  if (key == "mode")
    p.mode = v;
  else if (key == "clip")
    p.clip = number_value(key, v, "--privacy");
  else if (key == "noise_multiplier")
    p.noise_multiplier = number_value(key, v, "--privacy");
  else if (key == "target_epsilon")
    p.target_epsilon = number_value(key, v, "--privacy");
  else if (key == "delta")
    p.delta = number_value(key, v, "--privacy");
  else if (key == "epsilon_budget")
    p.epsilon_budget = number_value(key, v, "--privacy");
  else if (key == "target_quantile")
    p.target_quantile = number_value(key, v, "--privacy");
  else if (key == "clip_learning_rate")
    p.clip_learning_rate = number_value(key, v, "--privacy");
  else if (key == "clip_count_budget")
    p.clip_count_budget = number_value(key, v, "--privacy");
  else
    throw ConfigError("--privacy: unknown key '" + key + "'");
}

// KEY=VALUE pairs, comma separated, each handed to `set`.
template <typename Set>
void key_values(const std::string& text, const char* flag, Set set) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError(std::string(flag) + " '" + item + "': use KEY=VALUE");
    }
    set(item.substr(0, eq), item.substr(eq + 1));
    start = end + 1;
  }
}

// The federation's shape and its rounds.
void add_federation_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_option("--sites", a.sites, "number of sites")
      ->check(number_in(1, 256))
      ->capture_default_str();
  cmd.add_option("--regions", a.regions, "number of region aggregators (0: sites under root)")
      ->check(number_in(0, 256))
      ->capture_default_str();
  cmd.add_option("--rounds", a.rounds, "outer rounds")
      ->check(number_in(1, 1e6))
      ->capture_default_str();
  cmd.add_option("--inner-steps,-H", a.inner_steps, "local steps per round")
      ->check(number_in(1, 1e9))
      ->capture_default_str();
  cmd.add_option("--overlap-steps", a.overlap_steps,
                 "overlapped rounds: sites train on while their update goes up and merge the "
                 "next anchor this many steps later (1..inner steps); 0: blocking rounds")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  cmd.add_option_function<std::string>(
         "--streams",
         [&a](const std::string& v) { a.streams = v == "auto" ? kStreamsAuto : std::stoull(v); },
         "TCP connections per tree link, frames striped across them: auto (as many as pay, "
         "the default) or 1..16")
      ->check([](const std::string& v) -> std::string {
        if (v == "auto") return "";
        const std::string why = number_in(1, 16)(v);
        return why.empty() ? "" : "--streams: auto, or 1 to 16";
      })
      ->default_str("auto");
}

// What happens to nodes while the federation runs: deaths and restarts,
// sites that come late, leave or are added.
void add_node_event_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_option("--max-restarts", a.max_restarts,
                 "times a node that dies is started again (from its checkpoint) before the "
                 "demo gives up")
      ->check(number_in(0, 100))
      ->capture_default_str();
  cmd.add_option("--chaos", a.chaos,
                 "NODE@ROUND: that site or region is killed (SIGKILL) in that round, to watch "
                 "it restart and recover, e.g. site-0@3; NODE@ROUND:disk also deletes its "
                 "checkpoint directory, so it recovers from its parent's replica");
  cmd.add_option("--late", a.late,
                 "SITE@ROUND: that site is not there at the start (late_join) and is started "
                 "in that round; it counts from the next round boundary, e.g. site-3@5");
  cmd.add_option("--leave", a.leave,
                 "SITE@ROUND: that site leaves the federation gracefully as that round begins "
                 "(no round waits for it), e.g. site-1@8");
  cmd.add_option("--add-site", a.add_site,
                 "ROUND: in that round the operator adds one more site with a new topology "
                 "version signed by the admin (`fedwan topology sign`); the aggregators adopt "
                 "it and the new site counts from the next round boundary, e.g. 5");
}

void add_metrics_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_flag("--metrics", a.metrics,
               "every node serves Prometheus metrics and its status over HTTP on a free "
               "127.0.0.1 port (in the topology; `fedwan status --topology DIR/topology.yaml`)");
  cmd.add_option("--metrics-linger", a.metrics_linger_s,
                 "with --metrics: nodes keep serving their metrics this many seconds after they "
                 "finished (for a scraper's last look)")
      ->check(number_in(0, 3600, /*integer=*/false))
      ->capture_default_str();
}

// A flag's check: the parse's ConfigError message, or "" when it parses.
template <typename Result>
std::function<std::string(const std::string&)> parsed_by(Result (*parse)(const std::string&)) {
  return [parse](const std::string& text) {
    try {
      parse(text);
      return std::string();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
  };
}

// How updates go up and anchors come down.
void add_sync_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_option("--codec", a.codec, "delta codec: fp32, fp16, bf16, int8")->capture_default_str();
  cmd.add_option("--outer", a.outer, "outer optimizer: fedavg, diloco, fedadam")
      ->capture_default_str();
  cmd.add_option("--chunk-bytes", a.chunk_bytes, "fp32 bytes per chunk, a multiple of 4")
      ->check(number_in(4096, 4 << 20))
      ->capture_default_str();
  cmd.add_option("--aggregation", a.aggregation,
                 "what every aggregator checks on each child's chunk and how it combines them, "
                 "over the defaults: KEY=VALUE,... with keys rule, finite_check, max_abs, "
                 "replay_window, norm_bound.mode (adaptive|absolute|off), norm_bound.factor, "
                 "norm_bound.window, norm_bound.bound, norm_bound.action (refuse|clip), and "
                 "params.NAME for the rule's parameters; e.g. norm_bound.mode=off, or "
                 "rule=trimmed_mean,params.trim=1 (docs/topology.md, \"Aggregation\")")
      ->check(parsed_by(+[](const std::string& t) { return aggregation_settings(t); }));
  cmd.add_option("--root-aggregation", a.root_aggregation,
                 "the root's own aggregation settings, KEY=VALUE,... over --aggregation (its "
                 "children are the regions, or the sites without regions)");
  cmd.add_option("--region-aggregation", a.region_aggregation,
                 "every region's own aggregation settings, KEY=VALUE,... over --aggregation");
  cmd.add_option("--privacy", a.privacy,
                 "site-level differential privacy: KEY=VALUE,... with keys mode (central|local), "
                 "clip, noise_multiplier or target_epsilon, delta (default 1e-5), epsilon_budget, "
                 "and for adaptive clipping target_quantile, clip_learning_rate, "
                 "clip_count_budget; "
                 "e.g. mode=central,clip=1,target_epsilon=3 (docs/security.md, \"Differential "
                 "privacy\")")
      ->check(parsed_by(privacy_settings));
}

// The processes of a site and where they train.
void add_site_rank_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_option("--ranks-per-site", a.ranks_per_site,
                 "processes per site (ranks averaging their gradients every step, over NCCL "
                 "on GPUs or Gloo on the CPU; each trains on its slice of every minibatch)")
      ->check(number_in(1, 64))
      ->capture_default_str();
  cmd.add_option("--device", a.device,
                 "where the sites train: cuda (rank r of a site on GPU r % GPUs), cpu, or auto "
                 "(cuda when this build, the machine and LibTorch have CUDA and there is a GPU "
                 "per rank of a site; else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
}

// What the demo runs besides the federation, where it keeps its files, and
// its ports.
void add_workspace_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_flag("--no-baseline", a.no_baseline, "skip the central-training baseline");
  cmd.add_flag("--no-checkpoints", a.no_checkpoints,
               "the nodes keep no checkpoints and send no replicas (a node that dies is not "
               "restarted): to measure what durability costs");
  cmd.add_flag("--no-audit-log", a.no_audit_log,
               "the nodes keep no audit log (as nodes started without --audit-log): to measure "
               "what it costs; not with --late, --add-site or --chaos, which the demo follows "
               "through the audit logs");
  cmd.add_flag("--no-pace", a.no_pace,
               "aggregators do not pace their sites' uploads (aggregator --no-pace): to measure "
               "what pacing saves");
  cmd.add_option("--report", a.report, "write the JSON report here");
  cmd.add_option("--dir", a.work_dir,
                 "working directory (default: a new temporary one); a federation CA an earlier "
                 "run left there is reused, never replaced without --force");
  cmd.add_flag("--force", a.force,
               "replace the federation CA and bundles in --dir/pki with new ones");
  cmd.add_option("--base-port", a.base_port,
                 "first loopback port; the nodes take the ports after it (default: free ports)")
      ->check(number_in(1, 65000));
  cmd.add_option("--node-binary", a.node_binaries,
                 "NODE=PATH: start that node with the program at PATH instead of this fedwan "
                 "(it gets the same arguments): a modified build, or a site that misbehaves on "
                 "purpose for a robustness experiment; repeatable");
}

void add_link_flags(CLI::App& cmd, DemoArgs& a) {
  cmd.add_flag("--insecure-plaintext", a.insecure_plaintext,
               "run the demo's links without TLS or encryption (default: a fresh federation "
               "CA is provisioned and every link is mutual TLS)");
  cmd.add_option("--cipher", a.cipher, "frame cipher: aes-256-gcm, chacha20-poly1305")
      ->capture_default_str();
}

}  // namespace

AggregationSpec aggregation_settings(const std::string& text, const AggregationSpec& base,
                                     const char* flag) {
  AggregationSpec a = base;
  a.params.clear();
  bool new_rule = false;
  key_values(text, flag, [&](const std::string& k, const std::string& v) {
    set_aggregation(a, k, v, flag);
    new_rule = new_rule || k == "rule";
  });
  // A new rule starts without the base rule's params.
  if (!new_rule) {
    for (const auto& [name, value] : base.params) a.params.emplace(name, value);
  }
  if (!aggregation::has_rule(a.rule)) {
    throw ConfigError(std::string(flag) + ": unknown rule '" + a.rule + "'");
  }
  try {
    aggregation::make_rule(a.rule, a.params);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(flag) + ": " + e.what());
  }
  if (auto why = topology::aggregation_problem(a)) {
    throw ConfigError(std::string(flag) + ": " + *why);
  }
  return a;
}

PrivacySpec privacy_settings(const std::string& text) {
  PrivacySpec p;
  key_values(text, "--privacy",
             [&](const std::string& k, const std::string& v) { set_privacy(p, k, v); });
  // The checks that need no tree (the tree's are the topology's).
  FederationSpec f;
  f.privacy = p;
  f.codec = "fp32";
  if (auto why = topology::privacy_problem(f, /*regions=*/false)) {
    throw ConfigError("--privacy: " + *why);
  }
  return p;
}

void add_demo_flags(CLI::App& cmd, DemoArgs& a) {
  add_federation_flags(cmd, a);
  add_node_event_flags(cmd, a);
  add_metrics_flags(cmd, a);
  add_sync_flags(cmd, a);
  add_site_rank_flags(cmd, a);
  add_workspace_flags(cmd, a);
  add_link_flags(cmd, a);
  add_workload_flags(cmd, a.workload);
}

}  // namespace fedwan::cli
