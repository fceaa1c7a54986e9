// The chaos-test harness's audit replay: audit logs and payload stores
// written by hand, replayed, and compared with the root's own arithmetic
// (RoundAccumulator + the outer optimizer) fed the same updates.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregation/round_accumulator.hpp"
#include "aggregator/root_model.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/topology.hpp"
#include "harness/audit_replay.hpp"
#include "security/audit_log.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan::testing {
namespace {

namespace fs = std::filesystem;

// 2500 parameters in chunks of 1024: three chunks, the last one short.
const char* kTopology = R"(
job: replay-test
federation:
  rounds: 3
  codec: fp16
  chunk_bytes: 4096
  outer_optimizer: {name: diloco, lr: 0.7, momentum: 0.9}
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: eu, role: region, parent: root, endpoint: "tcp://127.0.0.1:7001"}
  - {id: us, role: region, parent: root, endpoint: "tcp://127.0.0.1:7002"}
  - {id: site-a, role: site, parent: eu}
  - {id: site-b, role: site, parent: us}
)";
constexpr size_t kElements = 2500;

// One update as the root received it.
struct Delivery {
  uint64_t round;
  std::string sender;
  uint32_t chunk;
  double weight;
  std::string codec;
  std::vector<uint8_t> payload;
  std::string sha;
};

class AuditReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "fedwan-replay-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    store_ = dir_ / "store";
    fs::create_directories(store_);
    audit_ = dir_ / "root.audit.jsonl";
    log_ = std::make_unique<security::AuditLog>(audit_.string(), "root");
    initial_.resize(kElements);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : initial_) x = u(rng);
  }
  void TearDown() override {
    log_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Encodes random values for (round, sender, chunk), stores the payload and
  // logs the update with `decision`. Returns the delivery.
  Delivery deliver(uint64_t round, const std::string& sender, uint32_t chunk, double weight,
                   const std::string& codec_name, const std::string& decision = "accepted") {
    const uint32_t n = plan_.size(chunk);
    std::mt19937 rng(
        static_cast<uint32_t>(round * 1000 + uint64_t{chunk} * 10 + sender.size() + seed_++));
    std::normal_distribution<float> g(0.0f, 0.05f);
    std::vector<float> values(n);
    for (float& v : values) v = g(rng);
    const Codec& codec = codec_by_name(codec_name);
    Delivery d{
        round, sender, chunk, weight, codec_name, std::vector<uint8_t>(codec.encoded_size(n)), ""};
    codec.encode(values.data(), n, nullptr, d.payload.data());
    const Sha256Digest digest = sha256(d.payload.data(), d.payload.size());
    d.sha = to_hex(digest.data(), digest.size());
    if (decision == "accepted") {
      std::ofstream(store_ / d.sha, std::ios::binary)
          .write(reinterpret_cast<const char*>(d.payload.data()),
                 static_cast<std::streamsize>(d.payload.size()));
    }
    log_->append("update", {{"sender", sender},
                            {"round", round},
                            {"chunk", chunk},
                            {"chunks", plan_.count()},
                            {"bytes", d.payload.size()},
                            {"weight", weight},
                            {"sha256", d.sha},
                            {"decision", decision},
                            {"codec", codec_name},
                            {"elements", n}});
    return d;
  }

  // Both regions deliver every chunk of `round` (interleaved, codecs mixed),
  // then the round closes. Returns the deliveries in log order.
  std::vector<Delivery> full_round(uint64_t round) {
    std::vector<Delivery> out;
    out.push_back(deliver(round, "us", 2, 1.0, "bf16"));
    out.push_back(deliver(round, "eu", 0, 3.0, "fp16"));
    out.push_back(deliver(round, "us", 0, 1.0, "bf16"));
    out.push_back(deliver(round, "eu", 2, 3.0, "fp32"));
    out.push_back(deliver(round, "eu", 1, 2.5, "fp16"));
    out.push_back(deliver(round, "us", 1, 1.5, "fp32"));
    log_->append("round_closed", {{"round", round}, {"children", 2}});
    return out;
  }

  // The root's own arithmetic over `deliveries` (grouped by round, in order):
  // its model is the anchor plus a residual, and each chunk's anchor update
  // (the topology's codec) moves the anchor when the round closes.
  std::vector<float> direct(const std::vector<Delivery>& deliveries) const {
    aggregator::RootModel model(initial_);
    const Codec& down = codec_by_name(topo_.federation().codec);
    aggregation::RoundAccumulator acc(plan_, {topo_.node("eu").index, topo_.node("us").index});
    auto outer = make_outer_optimizer(topo_.federation().outer, kElements);
    for (uint64_t round = 0;; ++round) {
      bool any = false;
      for (const Delivery& d : deliveries) any = any || d.round == round;
      if (!any) break;
      acc.open(round);
      outer->begin_round(round);
      std::vector<std::pair<uint32_t, std::vector<uint8_t>>> anchor;
      for (const Delivery& d : deliveries) {
        if (d.round != round) continue;
        const auto r =
            acc.add(round, topo_.node(d.sender).index, d.chunk, plan_.size(d.chunk), d.weight,
                    codec_by_name(d.codec), d.payload.data(), d.payload.size());
        EXPECT_EQ(r.outcome, aggregation::AddOutcome::kAccepted);
        if (!r.chunk_complete) continue;
        aggregation::ChunkSum cs = acc.take(d.chunk);
        const uint64_t off = plan_.offset(d.chunk);
        const uint32_t n = plan_.size(d.chunk);
        std::vector<float> global(n), update(n);
        model.global_chunk(off, n, global.data());
        outer->step(global.data(), cs.mean.data(), off, n);
        for (uint32_t k = 0; k < n; ++k) update[k] = global[k] - model.held()[off + k];
        std::vector<uint8_t> payload(down.encoded_size(n));
        down.encode(update.data(), n, nullptr, payload.data());
        model.settle_chunk(off, n, global.data(), down, payload.data());
        anchor.emplace_back(d.chunk, std::move(payload));
      }
      for (const auto& [c, payload] : anchor) {
        model.apply(plan_.offset(c), plan_.size(c), down, payload.data());
      }
    }
    return model.take_global();
  }

  ReplayResult replay() {
    log_->sync();
    return replay_root_audit(topo_, initial_, audit_, store_);
  }

  static bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  static std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += x + "\n";
    return s;
  }

  static bool mentions(const std::vector<std::string>& v, const std::string& what) {
    return joined(v).find(what) != std::string::npos;
  }

  Topology topo_ = Topology::parse(kTopology);
  tensor::ChunkPlan plan_ =
      tensor::ChunkPlan::from_bytes(kElements, topo_.federation().chunk_bytes);
  fs::path dir_, store_, audit_;
  std::unique_ptr<security::AuditLog> log_;
  std::vector<float> initial_;
  uint32_t seed_ = 0;
};

TEST_F(AuditReplay, ReplayEqualsTheRootsArithmeticBitForBit) {
  ASSERT_EQ(plan_.count(), 3u);
  std::vector<Delivery> all;
  for (uint64_t r = 0; r < 3; ++r) {
    for (Delivery& d : full_round(r)) all.push_back(std::move(d));
  }
  deliver(2, "eu", 0, 3.0, "fp16", "duplicate");  // refused: not part of the model
  const ReplayResult res = replay();
  EXPECT_TRUE(res.problems.empty()) << joined(res.problems);
  EXPECT_TRUE(res.notes.empty()) << joined(res.notes);
  EXPECT_EQ(res.rounds_committed, 3u);
  EXPECT_EQ(res.accepted, 18u);
  EXPECT_EQ((res.accepted_by_round_sender.at({1, "eu"})), 3);
  const std::vector<float> want = direct(all);
  EXPECT_TRUE(bit_identical(res.global, want));
  EXPECT_FALSE(bit_identical(res.global, initial_));
}

TEST_F(AuditReplay, ResumedMarkerDiscardsUpdatesThatWereNeverCommitted) {
  std::vector<Delivery> committed = full_round(0);
  // Round 1 starts, the root dies, and restarts from its round-1 checkpoint.
  deliver(1, "eu", 0, 3.0, "fp16");
  deliver(1, "us", 0, 1.0, "bf16");
  log_->append("resumed", {{"round", 1}});
  for (uint64_t r = 1; r < 3; ++r) {
    for (Delivery& d : full_round(r)) committed.push_back(std::move(d));
  }
  const ReplayResult res = replay();
  EXPECT_TRUE(res.problems.empty()) << joined(res.problems);
  EXPECT_EQ(res.discarded, 2u);
  EXPECT_EQ(res.accepted, 18u);
  EXPECT_EQ((res.accepted_by_round_sender.at({1, "eu"})), 3);  // not 4
  EXPECT_EQ(res.rounds_committed, 3u);
  EXPECT_TRUE(bit_identical(res.global, direct(committed)));
}

TEST_F(AuditReplay, ReportsDoubleAcceptanceMissingAndCorruptPayloadsAndEmptyChunks) {
  full_round(0);
  // Round 1: eu's chunk 0 accepted twice; us's chunk 1 payload lost; eu's
  // chunk 1 payload corrupted; chunk 2 accepted from nobody, yet closed.
  deliver(1, "eu", 0, 3.0, "fp16");
  deliver(1, "us", 0, 1.0, "bf16");
  deliver(1, "eu", 0, 3.0, "fp16");
  const Delivery lost = deliver(1, "us", 1, 1.0, "fp16");
  const Delivery corrupt = deliver(1, "eu", 1, 1.0, "fp16");
  log_->append("round_closed", {{"round", 1}});
  fs::remove(store_ / lost.sha);
  std::fstream f(store_ / corrupt.sha, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(3);
  f.put('\x55');
  f.close();

  const ReplayResult res = replay();
  EXPECT_TRUE(mentions(res.problems, "round 1, sender 'eu', chunk 0 was accepted more than once"))
      << joined(res.problems);
  EXPECT_TRUE(mentions(res.problems, "round 1 chunk 1 from 'us' (entry")) << joined(res.problems);
  EXPECT_TRUE(mentions(res.problems, "is missing")) << joined(res.problems);
  EXPECT_TRUE(mentions(res.problems, "does not hash to its name")) << joined(res.problems);
  EXPECT_TRUE(mentions(res.problems, "round 1 closed, but chunk 1 has no usable accepted update"))
      << joined(res.problems);
  EXPECT_TRUE(mentions(res.problems, "round 1 closed, but chunk 2 has no usable accepted update"))
      << joined(res.problems);
  EXPECT_EQ(res.problems.size(), 5u) << joined(res.problems);
  EXPECT_EQ((res.accepted_by_round_sender.at({1, "eu"})), 3);

  const std::vector<AuditEntry> entries = read_audit(audit_);
  const EffectiveAudit eff = effective_audit(entries, "root");
  EXPECT_EQ(duplicate_acceptances(eff.accepted), (std::set<UpdateKey>{{1, "eu", 0}}));
}

TEST_F(AuditReplay, ReportsABrokenChainAndReplaysOnlyWhatPrecedesIt) {
  full_round(0);
  full_round(1);
  log_.reset();
  std::ifstream in(audit_);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  in.close();
  ASSERT_EQ(lines.size(), 14u);
  const size_t at = lines[8].find("\"weight\":3.0");
  ASSERT_NE(at, std::string::npos) << lines[8];
  lines[8].replace(at, 12, "\"weight\":9.0");  // entry 8: round 1, eu's chunk 0
  std::ofstream out(audit_, std::ios::trunc);
  for (const std::string& l : lines) out << l << "\n";
  out.close();

  const ReplayResult res = replay_root_audit(topo_, initial_, audit_, store_);
  EXPECT_TRUE(mentions(res.problems, "audit chain fails at line 9")) << joined(res.problems);
  EXPECT_EQ(res.accepted, 7u);  // round 0's six and round 1's first
  EXPECT_EQ(res.rounds_committed, 1u);
  EXPECT_TRUE(mentions(res.notes, "round 1 has accepted updates but no round_closed entry"))
      << joined(res.notes);
}

TEST_F(AuditReplay, EntriesFromAnotherNodeAreReportedAndSkipped) {
  full_round(0);
  log_.reset();
  const fs::path other = dir_ / "eu.audit.jsonl";
  {
    security::AuditLog eu(other.string(), "eu");
    eu.append("update", {{"sender", "site-a"},
                         {"round", 0},
                         {"chunk", 0},
                         {"weight", 1.0},
                         {"sha256", std::string(64, '0')},
                         {"decision", "accepted"}});
  }
  const ReplayResult res = replay_root_audit(topo_, initial_, other, store_);
  EXPECT_TRUE(mentions(res.problems, "is from node 'eu', not 'root'")) << joined(res.problems);
  EXPECT_EQ(res.accepted, 0u);
  EXPECT_TRUE(bit_identical(res.global, initial_));
}

}  // namespace
}  // namespace fedwan::testing
