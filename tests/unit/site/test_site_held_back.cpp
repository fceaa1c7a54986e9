// A site paced by its parent (docs/protocol.md, "Pacing") waits while the
// parent holds its update back; a parent that goes on holding it back,
// telling it so with every heartbeat (another child never delivers), fails
// the sync after round_timeout with a clear error, as a round that never
// closes does. It never hangs. A scripted root plays the parent.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "wire/frame.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kElements = 4096;
constexpr uint32_t kChunk = 1024;  // four chunks

TEST(SiteHeldBack, AParentThatNeverLetsTheUpdateGoFailsTheSyncAtTheRoundTimeout) {
  testing::TempDir dir;
  testing::IpcTree t;
  t.job = "held-back";
  t.rounds = 2;
  t.chunk_bytes = kChunk * sizeof(float);
  // Longer than the round timeout below: a loaded machine's pause between
  // two allowances never has the site judge its parent silent first.
  t.heartbeat_timeout_s = 10;
  const Topology topo = testing::ipc_tree(dir.path(), t);
  std::atomic<int> deltas{0};
  // One chunk of round 0's update, told before the welcome and again with
  // every heartbeat the site sends.
  const auto pace = [](testing::FakeRoot& r, const std::string& child) {
    wire::FrameHeader h = r.header(wire::MsgType::kHeartbeat, 0);
    h.flags = wire::kFlagPace;
    r.send(child, h, wire::encode_pace(wire::PacePayload{1, 1}));
  };
  testing::FakeRoot root(topo, topo.root().endpoint, /*mute=*/false);
  // Ahead of the welcome, as an aggregator tells it: the site has its
  // allowance before join() returns, so its sync never starts unpaced.
  root.on_hello = [&](testing::FakeRoot& r, const std::string& child, const wire::ParsedFrame& f) {
    pace(r, child);
    testing::welcome_unchanged(r, child, f, kElements);
  };
  root.on_other = [&](testing::FakeRoot& r, const std::string& child, const wire::ParsedFrame& f) {
    if (f.header.type == wire::MsgType::kDelta) deltas += 1;
    if (f.header.type == wire::MsgType::kHeartbeat) pace(r, child);
  };
  root.serving = true;
  std::vector<float> params(kElements, 0.25f);
  SiteOptions o = testing::site_options(topo, "site-0", 30s);
  o.round_timeout = 2s;
  SiteCore site(std::move(o), params.data(), params.size());
  site.join();
  for (float& p : params) p += 0.5f;  // trained
  std::string what;
  try {
    site.sync();
    ADD_FAILURE() << "a round whose update was never let go ended";
  } catch (const TimeoutError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("held back chunk 1 of 4"), std::string::npos) << what;
  EXPECT_NE(what.find("round_timeout"), std::string::npos) << what;
  EXPECT_EQ(deltas.load(), 1) << "the site sent more than it was allowed";
}

}  // namespace
}  // namespace fedwan
