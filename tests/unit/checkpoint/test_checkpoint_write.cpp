// Writing a checkpoint whose large sections are hashed on helper threads
// while they are written (checkpoint_write.cpp): the file and the digests
// returned are those of hashing every section first, in any mix with
// small, empty and produced sections; a write that fails part way leaves
// the old checkpoint and nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

using fedwan::testing::TempDir;

constexpr size_t kMiB = size_t{1} << 20;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13 + (i >> 11));
  return v;
}

// Sections on both sides of the size from which they are hashed aside, a
// viewed one, a produced one between them, an empty one.
struct Mixed {
  std::vector<uint8_t> model = pattern(20 * kMiB + 5, 1);
  std::vector<uint8_t> state = pattern(4 * kMiB, 2);
  std::vector<uint8_t> made = pattern(6 * kMiB + 1, 3);
  std::vector<uint8_t> just_under = pattern(4 * kMiB - 1, 4);

  Checkpoint checkpoint(bool produce) const {
    Checkpoint c;
    c.round = 3;
    c.node_id = "root";
    CheckpointSection view;
    view.name = "model";
    view.view = model.data();
    view.view_size = model.size();
    c.sections.push_back(view);
    c.sections.push_back({"meta", {'{', '}'}});
    if (produce) {
      CheckpointSection p;
      p.name = "made";
      p.produce = [this](const CheckpointSection::Sink& sink) {
        for (size_t at = 0; at < made.size(); at += 3 * kMiB) {
          sink(made.data() + at, std::min(3 * kMiB, made.size() - at));
        }
      };
      c.sections.push_back(p);
    } else {
      c.sections.push_back({"made", made});
    }
    c.sections.push_back({"state", state});
    c.sections.push_back({"empty", {}});
    c.sections.push_back({"just-under", just_under});
    return c;
  }
};

TEST(CheckpointWrite, SectionsHashedAsideGiveTheFileAndDigestsOfHashingFirst) {
  TempDir d;
  const Mixed m;
  const Checkpoint produced = m.checkpoint(true);
  const std::vector<Sha256Digest> digests = write_checkpoint(d / "a", produced);
  const Checkpoint back = read_checkpoint(d / "a");
  ASSERT_EQ(back.sections.size(), produced.sections.size());
  ASSERT_EQ(digests.size(), produced.sections.size());
  const std::vector<const std::vector<uint8_t>*> want = {&m.model, nullptr, &m.made,
                                                         &m.state, nullptr, &m.just_under};
  for (size_t i = 0; i < back.sections.size(); ++i) {
    const std::vector<uint8_t>& bytes = back.sections[i].bytes;
    if (want[i] != nullptr) EXPECT_TRUE(bytes == *want[i]) << back.sections[i].name;
    EXPECT_EQ(digests[i], sha256(bytes.data(), bytes.size())) << back.sections[i].name;
  }
  // The same checkpoint with every section's bytes at hand writes the
  // same file.
  write_checkpoint(d / "b", m.checkpoint(false));
  EXPECT_EQ(testing::slurp(d / "a"), testing::slurp(d / "b"));
}

// A producer failing after a section is being hashed aside: the helpers
// stop, the old checkpoint stays, no temporary file is left.
TEST(CheckpointWrite, AFailureWhileSectionsAreHashedAsideKeepsTheOldCheckpoint) {
  TempDir d;
  const Mixed m;
  write_checkpoint(d / "ckpt", m.checkpoint(false));
  const std::vector<uint8_t> before = testing::slurp(d / "ckpt");
  Checkpoint bad = m.checkpoint(false);
  CheckpointSection p;
  p.name = "fails";
  p.produce = [](const CheckpointSection::Sink& sink) {
    const std::vector<uint8_t> part(kMiB, 9);
    sink(part.data(), part.size());
    throw Error("disk full, say");
  };
  bad.sections.insert(bad.sections.begin() + 1, p);
  EXPECT_THROW(write_checkpoint(d / "ckpt", bad), Error);
  EXPECT_EQ(testing::slurp(d / "ckpt"), before);
  EXPECT_EQ(testing::entries(d.path()), std::vector<std::string>{"ckpt"});
}

}  // namespace
}  // namespace fedwan
