// A parent's replicas of its children's checkpoints are bounded in size
// (checkpoint/replica_store.hpp, ReplicaStore::set_max_bytes): an
// authenticated child that announces a file larger than the limit is refused
// at its first piece, before a byte reaches the parent's disk, so it cannot
// fill that disk with a transfer it never finishes.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "aggregator/child_claims.hpp"
#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/replica_store.hpp"
#include "harness/temp_dir.hpp"
#include "node/node_config.hpp"

namespace fedwan::checkpoint {
namespace {

using Kind = ReplicaStore::Result::Kind;
using fedwan::testing::entries;
using fedwan::testing::TempDir;

std::array<uint8_t, 32> topology() {
  std::array<uint8_t, 32> d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(0xa0 + i);
  return d;
}

std::vector<uint8_t> checkpoint_of(const TempDir& d, const std::string& node, size_t bytes) {
  Checkpoint c;
  c.round = 4;
  c.topology_digest = topology();
  c.node_id = node;
  c.sections.push_back({"params", std::vector<uint8_t>(bytes, 0x3c)});
  write_checkpoint(d / "src.fwck", c);
  std::ifstream in(d / "src.fwck", std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ReplicaLimit, AFileAnnouncedOverTheLimitIsRefusedBeforeAnythingIsWritten) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology());
  store.set_max_bytes(1 << 20);
  const std::vector<uint8_t> piece(4096, 0x5a);
  for (const uint64_t total : {(uint64_t{1} << 20) + 1, uint64_t{1} << 40, UINT64_MAX}) {
    const ReplicaStore::Result r =
        store.add_piece("site-a", 4, 0, 1u << 20, total, piece.data(), piece.size());
    ASSERT_EQ(r.kind, Kind::kRefused) << total;
    EXPECT_NE(r.detail.find("announces " + std::to_string(total) + " bytes"), std::string::npos)
        << r.detail;
    EXPECT_NE(r.detail.find("replica_max_bytes"), std::string::npos) << r.detail;
    // The pieces after it find no transfer to continue.
    EXPECT_EQ(store.add_piece("site-a", 4, 1, 1u << 20, total, piece.data(), piece.size()).kind,
              Kind::kRefused);
  }
  EXPECT_TRUE(entries(d / "replicas" / "site-a").empty());
  EXPECT_TRUE(store.rounds("site-a").empty());
}

TEST(ReplicaLimit, AFileWithinTheLimitIsKept) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology());
  const std::vector<uint8_t> file = checkpoint_of(d, "site-a", 5000);
  store.set_max_bytes(file.size());  // exactly its size
  const ReplicaStore::Result r =
      store.add_piece("site-a", 4, 0, 1, file.size(), file.data(), file.size());
  ASSERT_EQ(r.kind, Kind::kStored) << r.detail;
  EXPECT_EQ(store.rounds("site-a"), std::vector<uint64_t>{4});
  // One byte less of room refuses the same file.
  store.set_max_bytes(file.size() - 1);
  EXPECT_EQ(store.add_piece("site-a", 5, 0, 1, file.size(), file.data(), file.size()).kind,
            Kind::kRefused);
  EXPECT_EQ(store.rounds("site-a"), std::vector<uint64_t>{4});
}

TEST(ReplicaLimit, TheParentsLimitFollowsTheModelUnlessConfigured) {
  using aggregator::replica_max_bytes;
  constexpr uint64_t kSlack = uint64_t{64} << 20;
  EXPECT_EQ(replica_max_bytes(0, 0), 0u);  // the model's size not known: none taken
  EXPECT_EQ(replica_max_bytes(0, 1000), 16 * 4000 + kSlack);
  EXPECT_EQ(replica_max_bytes(0, 100'000'000), uint64_t{6'400'000'000} + kSlack);
  EXPECT_EQ(replica_max_bytes(12345, 100'000'000), 12345u);  // configured wins
  EXPECT_EQ(replica_max_bytes(12345, 0), 12345u);
  EXPECT_EQ(replica_max_bytes(0, UINT64_MAX / 2), UINT64_MAX);  // saturates, never wraps
  EXPECT_EQ(replica_max_bytes(0, uint64_t{1} << 59), UINT64_MAX);
  // The same bound the wire puts on a checkpoint's frames.
  EXPECT_EQ(replica_max_bytes(0, 3000), node::checkpoint_max_bytes(3000));
}

}  // namespace
}  // namespace fedwan::checkpoint
