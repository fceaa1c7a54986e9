// A site takes each chunk of the next anchor into its anchor and its params
// as the chunk comes (once that chunk's delta went). A sync() that fails
// with part of the next anchor in has no round left to go back to: later
// calls refuse, saying how to recover, and never send an update computed
// against a half-new anchor. One that fails before any chunk came in may be
// called again. A scripted root plays the parent.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/site_core.hpp"
#include "harness/fake_root.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/temp_dir.hpp"
#include "node/node_frames.hpp"
#include "tensor/chunk_plan.hpp"
#include "wire/frame.hpp"

namespace fedwan {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kElements = 4096;
constexpr uint32_t kChunk = 1024;  // four chunks
constexpr float kStep = 0.25f;     // exact in fp16

struct Outcome {
  std::vector<float> initial;
  std::vector<float> trained;
  std::vector<float> params;  // after the failed sync
  std::string first;          // what the failed sync said
  std::string second;         // what the next sync() said
  int deltas_first = 0;       // delta chunks the root got by the first failure
  int deltas_second = 0;      // and by the second
};

// The site joins (the root welcomes it at round 0, no change), trains and
// syncs; the root heartbeats but never closes the round. With
// `anchor_chunk`, once delta chunk 0 is in it sends chunk 0 of round 1's
// anchor (every value + kStep). The sync times out after 4 s (time for the
// root's answer on a loaded machine); then sync() is called once more.
Outcome run(bool anchor_chunk) {
  testing::TempDir dir;
  testing::IpcTree t;
  t.job = "mid-anchor";
  t.rounds = 3;
  t.chunk_bytes = kChunk * sizeof(float);
  const Topology topo = testing::ipc_tree(dir.path(), t);
  Outcome out;
  out.initial.resize(kElements);
  for (size_t i = 0; i < kElements; ++i) out.initial[i] = 0.001f * static_cast<float>(i % 101);
  std::atomic<int> deltas{0};
  testing::FakeRoot root(topo, topo.root().endpoint, /*mute=*/false);
  root.on_hello = [](testing::FakeRoot& r, const std::string& child, const wire::ParsedFrame& f) {
    testing::welcome_unchanged(r, child, f, kElements);
  };
  root.on_other = [&](testing::FakeRoot& r, const std::string& child, const wire::ParsedFrame& f) {
    if (f.header.type != wire::MsgType::kDelta) return;
    if (deltas.fetch_add(1) != 0 || !anchor_chunk || f.header.chunk_index != 0) return;
    const Codec& c = codec_by_name("fp16");
    const std::vector<float> step(kChunk, kStep);
    std::vector<uint8_t> payload(c.encoded_size(kChunk));
    c.encode(step.data(), kChunk, nullptr, payload.data());
    const tensor::ChunkPlan plan(kElements, kChunk);
    r.send(child,
           node::chunk_header(topo, topo.root().index, wire::MsgType::kAnchor, 1, plan, 0, c.id()),
           payload);
  };
  root.serving = true;
  std::vector<float> params = out.initial;
  SiteOptions o = testing::site_options(topo, "site-0", 30s);
  o.round_timeout = 4s;
  SiteCore site(std::move(o), params.data(), params.size());
  site.join();
  for (float& p : params) p += 0.5f;  // trained
  out.trained = params;
  try {
    site.sync();
    ADD_FAILURE() << "a round the root never closed ended";
  } catch (const TimeoutError& e) {
    out.first = e.what();
  }
  out.params = params;
  // Between calls nothing is sent: what is on its way arrives meanwhile.
  std::this_thread::sleep_for(300ms);
  out.deltas_first = deltas.load();
  try {
    site.sync();
    ADD_FAILURE() << "a round the root never closed ended";
  } catch (const Error& e) {
    out.second = e.what();
  }
  std::this_thread::sleep_for(300ms);
  out.deltas_second = deltas.load();
  return out;
}

TEST(SiteMidAnchor, AnAnchorChunkGoesIntoParamsAsItComesAndAFailedSyncIsNotReused) {
  const Outcome o = run(/*anchor_chunk=*/true);
  EXPECT_NE(o.first.find("no anchor for round 1"), std::string::npos) << o.first;
  EXPECT_NE(o.first.find("1 of 4 chunks in"), std::string::npos) << o.first;
  // Chunk 0 is the next anchor's (the old anchor plus the step), the rest
  // still what was trained.
  for (size_t i = 0; i < kElements; ++i) {
    const float want = i < kChunk ? o.initial[i] + kStep : o.trained[i];
    ASSERT_EQ(o.params[i], want) << "element " << i;
  }
  // The next sync() refuses at once: an update against that anchor would
  // undo the chunk that came, and the round it began from is gone.
  EXPECT_NE(o.second.find("a sync failed with part of the next anchor taken in"), std::string::npos)
      << o.second;
  EXPECT_NE(o.second.find("build a new SiteCore"), std::string::npos) << o.second;
  EXPECT_GE(o.deltas_first, 4);
  EXPECT_EQ(o.deltas_second, o.deltas_first) << "a refused sync sent its update again";
}

TEST(SiteMidAnchor, ASyncThatFailedBeforeAnyAnchorChunkMayBeCalledAgain) {
  const Outcome o = run(/*anchor_chunk=*/false);
  EXPECT_NE(o.first.find("0 of 4 chunks in"), std::string::npos) << o.first;
  EXPECT_EQ(o.params, o.trained);
  // Sent again and timed out again: not refused.
  EXPECT_NE(o.second.find("no anchor for round 1"), std::string::npos) << o.second;
  EXPECT_EQ(o.second.find("build a new SiteCore"), std::string::npos) << o.second;
  EXPECT_GE(o.deltas_first, 4);
  EXPECT_GE(o.deltas_second, o.deltas_first + 4);
}

}  // namespace
}  // namespace fedwan
