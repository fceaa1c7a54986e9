// A region's weight in a round reaches its parent before the round's first
// aggregate, however the round opened. A parent that restarted from an
// older checkpoint knows only the weights it saved; judged by those, a
// round whose aggregate lacks a site that has left since can never close.
// Heartbeats here are 5 s apart, so a report that rode only on them would
// come after the aggregate. A scripted root plays the parent: it welcomes
// the region at round 0 and, once the region's aggregate of round 0 is in,
// sends the anchor of round 1 (the same model: one chunk that changes
// nothing).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/aggregator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/node_spawner.hpp"
#include "harness/node_threads.hpp"
#include "harness/temp_dir.hpp"
#include "harness/wait_for.hpp"
#include "wire/frame.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;
using testing::wait_for;

constexpr uint64_t kElements = 1000;

// What the region sent up, in order.
struct Seen {
  wire::MsgType type;
  uint64_t round;
  bool membership;  // a heartbeat with a membership report
  double weight;    // its weight
};

class RecordingRoot {
 public:
  explicit RecordingRoot(const Topology& topo) : root_(topo, topo.root().endpoint, false) {
    root_.on_hello = [this](testing::FakeRoot& r, const std::string& child,
                            const wire::ParsedFrame& f) {
      wire::HelloPayload hello;
      if (!wire::decode_hello(f.payload, f.payload_size, &hello)) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        digest_ = hello.model_digest;
      }
      welcome(r, child, 0);
    };
    root_.on_other = [this](testing::FakeRoot& r, const std::string& child,
                            const wire::ParsedFrame& f) {
      Seen s{f.header.type, f.header.round, false, 0};
      if (f.header.type == wire::MsgType::kHeartbeat &&
          (f.header.flags & wire::kFlagMembership) != 0) {
        wire::MembershipPayload m;
        if (wire::decode_membership(f.payload, f.payload_size, &m)) {
          s.membership = true;
          s.weight = m.weight;
        }
      }
      bool again = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.push_back(s);
        again = s.type == wire::MsgType::kDelta && s.round == 0 && !welcomed_again_;
        welcomed_again_ = welcomed_again_ || again;
      }
      if (again) unchanged_anchor(r, child, 1);
    };
    root_.serving = true;
  }

  std::vector<Seen> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void welcome(testing::FakeRoot& r, const std::string& child, uint64_t round) {
    std::array<uint8_t, 32> digest;
    {
      std::lock_guard<std::mutex> lock(mu_);
      digest = digest_;
    }
    wire::FrameHeader h = r.header(wire::MsgType::kWelcome, round);
    h.flags = wire::kFlagNoChange;
    h.total_elements = kElements;
    r.send(child, h, std::vector<uint8_t>(digest.begin(), digest.end()));
  }

  static void unchanged_anchor(testing::FakeRoot& r, const std::string& child, uint64_t round) {
    const Codec& fp32 = *codec_by_id(CodecId::kFp32);
    const std::vector<float> nothing(kElements, -0.0f);  // x + -0.0 is x
    std::vector<uint8_t> payload(fp32.encoded_size(kElements));
    fp32.encode(nothing.data(), kElements, nullptr, payload.data());
    wire::FrameHeader h = r.header(wire::MsgType::kAnchor, round);
    h.codec = static_cast<uint8_t>(CodecId::kFp32);
    h.chunk_index = 0;
    h.chunk_count = 1;
    h.element_count = kElements;
    h.total_elements = kElements;
    r.send(child, h, payload);
  }

  mutable std::mutex mu_;
  std::array<uint8_t, 32> digest_{};
  bool welcomed_again_ = false;
  std::vector<Seen> seen_;
  testing::FakeRoot root_;  // last: its thread runs the handlers over the members above
};

TEST(RegionMembershipOrder, EachRoundsFirstAggregateFollowsAReportOfItsWeight) {
  testing::TempDir dir;
  testing::IpcTree t;
  t.job = "membership-order";
  t.rounds = 3;
  t.region = true;
  t.heartbeat_s = 5;
  t.heartbeat_timeout_s = 30;
  const Topology topo = testing::ipc_tree(dir.path(), t);
  std::vector<float> init(kElements);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.003f * static_cast<float>(i % 83);
  RecordingRoot root(topo);
  // The region holds the model already, as after an earlier round.
  testing::NodeSpawner nodes;
  testing::spawn_aggregator(nodes, topo, "region-0", init, nullptr, [&](AggregatorOptions& o) {
    o.initial_model = init;
    o.spill_from_bytes = AggregatorOptions{}.spill_from_bytes;
  });
  std::vector<float> params = init;
  SiteCore site(testing::site_options(topo, "site-0", 60s), params.data(), params.size());
  std::atomic<int> synced{0};
  std::thread runner([&] {
    try {
      site.join();
      for (int round = 0; round < 2; ++round) {
        for (float& p : params) p += 0.125f * static_cast<float>(round + 1);  // trained
        site.sync();
        synced += 1;
      }
    } catch (const std::exception&) {
      // stopped
    }
  });
  auto delta_of = [&](uint64_t round) {
    for (const Seen& s : root.seen()) {
      if (s.type == wire::MsgType::kDelta && s.round == round) return true;
    }
    return false;
  };
  const bool both = wait_for([&] { return delta_of(0) && delta_of(1); }, 30s);
  site.stop();
  runner.join();
  nodes.stop();
  nodes.join();
  const std::string region_ended = nodes.errors();
  std::string order;
  for (const Seen& s : root.seen()) {
    order += " " + std::to_string(static_cast<int>(s.type)) + "@" + std::to_string(s.round) +
             (s.membership ? "(weight " + std::to_string(s.weight) + ")" : "");
  }
  ASSERT_TRUE(both) << "the region did not send aggregates of rounds 0 and 1; it sent" << order
                    << " (" << synced.load() << " syncs done)";
  EXPECT_TRUE(region_ended.empty() || region_ended.find("stopped") != std::string::npos)
      << region_ended;
  const double site_weight = topo.find("site-0")->weight;
  for (uint64_t round = 0; round < 2; ++round) {
    bool reported = false;
    for (const Seen& s : root.seen()) {
      if (s.type == wire::MsgType::kDelta && s.round == round) break;
      if (s.membership && s.round == round) {
        reported = true;
        EXPECT_DOUBLE_EQ(s.weight, site_weight) << "round " << round;
      }
    }
    EXPECT_TRUE(reported) << "the region's first aggregate of round " << round
                          << " came before any report of its weight in that round";
  }
}

}  // namespace
}  // namespace fedwan
