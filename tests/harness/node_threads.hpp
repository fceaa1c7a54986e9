// Nodes of a test federation as threads, for tests that drive one child by
// hand (harness/raw_site.hpp) beside real aggregators and sites: start each
// node with what it should do, collect their errors, join them all (also
// when a test fails early). Plus the small pieces those tests share: a
// small fp32 federation, an aggregator's and a synthetic site's run, and
// reading audit logs and alarms.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fedwan/aggregator.hpp"
#include "fedwan/site_core.hpp"
#include "fedwan/synthetic.hpp"
#include "harness/federation_fixture.hpp"

namespace fedwan::testing {

class NodeThreads {
 public:
  NodeThreads() = default;
  ~NodeThreads() { join(); }
  NodeThreads(const NodeThreads&) = delete;
  NodeThreads& operator=(const NodeThreads&) = delete;

  // Runs `fn` on a thread; an exception it throws is kept as "who: what".
  void start(const std::string& who, std::function<void()> fn) {
    threads_.emplace_back([this, who, fn = std::move(fn)] {
      try {
        fn();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu_);
        errors_.push_back(who + ": " + e.what());
      }
    });
  }

  // Aggregator `id` of `topo` (the root with `init`); its summary goes to
  // *summary when given. `adjust` may change the options first.
  void aggregator(const Topology& topo, const std::string& id, const std::vector<float>& init,
                  AggregatorSummary* summary = nullptr,
                  std::function<void(AggregatorOptions&)> adjust = {}) {
    start(id, [&topo, id, init, summary, adjust] {
      AggregatorOptions o;
      o.topology = topo;
      o.node_id = id;
      if (topo.node(id).role == Role::kRoot) o.initial_model = init;
      o.join_timeout = std::chrono::seconds(60);
      o.security = security_for(topo, id);
      if (adjust) adjust(o);
      AggregatorSummary s = Aggregator(std::move(o)).run();
      if (summary != nullptr) *summary = std::move(s);
    });
  }

  // Site `id` training the synthetic workload (`steps` a round) to the end.
  void site(const Topology& topo, const std::string& id, const std::vector<float>& init,
            uint64_t seed, uint64_t steps) {
    start(id, [&topo, id, init, seed, steps] {
      std::vector<float> params = init;
      SiteCore site(site_options(topo, id, std::chrono::seconds(60)), params.data(),
                    params.size());
      SyncResult r = site.join();
      while (!r.finished) {
        synthetic::local_steps(params.data(), params.size(), topo.node(id).index, steps, seed);
        r = site.sync();
      }
    });
  }

  void join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }
  // After join(): "" when every node ended well, else their errors.
  std::string errors() const {
    std::string out;
    for (const std::string& e : errors_) out += e + "\n";
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
};

// A federation small enough to reason about chunk by chunk: fp32, chunks of
// 1024 elements, 2 local steps a round.
inline FederationSpec small_fp32_federation(uint64_t rounds) {
  FederationSpec fed;
  fed.rounds = rounds;
  fed.inner_steps = 2;
  fed.codec = "fp32";
  fed.chunk_bytes = 4096;
  fed.round_timeout_s = 30;
  return fed;
}

// The entries of an audit log, parsed.
inline std::vector<nlohmann::json> audit_entries(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return out;
}

// Entries of `event` whose fields mention `needle`.
inline size_t count_audit(const std::filesystem::path& path, const std::string& event,
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

// Whether `alarms` ("kind: message") holds one of `kind`.
inline bool has_alarm(const std::vector<std::string>& alarms, const std::string& kind) {
  for (const std::string& a : alarms) {
    if (a.rfind(kind + ":", 0) == 0) return true;
  }
  return false;
}

}  // namespace fedwan::testing
