// A replica image read with its sections left in the file
// (CheckpointReadOptions), as a restarting node reads it: each section is
// decoded as it streams from the file, never held whole. What recovery
// relies on: the bytes decoded are those of the image read into memory,
// whatever piece boundaries fall inside a section, and bytes changed in the
// file after it was verified are a CryptoError naming the section.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "checkpoint/replica_image.hpp"
#include "fedwan/error.hpp"
#include "harness/error_message.hpp"
#include "harness/random_floats.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;

// 1.5M values: a residual's bf16 planes (about 1.5 MB compressed, then 1.5
// MB raw) and a near-random blob of 9 MiB span several 4 MiB read pieces,
// with the frame's end inside one.
constexpr size_t kN = 1500000;

struct State {
  std::vector<float> params, anchor, residual;
  std::vector<uint16_t> held;  // a residual kept in bf16
  std::vector<uint8_t> blob;
};

State state() {
  State s;
  s.anchor = testing::random_floats(kN, 11);
  s.params = s.anchor;
  const std::vector<float> moved = testing::random_floats(kN / 97 + 1, 12, 1e-3f);
  for (size_t i = 0; i < kN; i += 97) s.params[i] += moved[i / 97];
  s.residual = testing::random_floats(kN, 13, 1e-6f);
  std::mt19937 rng(14);
  s.held.resize(kN);
  for (uint16_t& v : s.held) v = static_cast<uint16_t>(rng());
  s.blob.resize(9 * (size_t{1} << 20) + 5);
  for (uint8_t& b : s.blob) b = static_cast<uint8_t>(rng());
  return s;
}

const checkpoint::ReplicaPlan kPlan{"anchor", {"params"}, {"residual"}, {"held"}};

Checkpoint checkpoint_of(const State& s) {
  Checkpoint c;
  c.round = 4;
  c.node_id = "site-a";
  c.sections.push_back(checkpoint::float_section("params", s.params.data(), kN));
  c.sections.push_back(checkpoint::float_section("anchor", s.anchor.data(), kN));
  c.sections.push_back(checkpoint::float_section("residual", s.residual.data(), kN));
  CheckpointSection held;
  held.name = "held";
  held.view = reinterpret_cast<const uint8_t*>(s.held.data());
  held.view_size = kN * sizeof(uint16_t);
  c.sections.push_back(std::move(held));
  c.sections.push_back({"optimizer", s.blob});
  c.sections.push_back({"empty", {}});  // a caller's blob may be
  const std::string meta = R"({"role":"site","data_position":5})";
  c.sections.push_back({"meta", std::vector<uint8_t>(meta.begin(), meta.end())});
  return c;
}

std::vector<uint8_t> decoded(const Checkpoint& image, const std::string& name, const State& s) {
  std::vector<uint8_t> out(checkpoint::replica_section_size(image, name).value_or(0), 0xEE);
  checkpoint::expand_replica_section(image, name, s.anchor.data(), kN, out.data(), out.size());
  return out;
}

// The image of s's checkpoint, written to `p`.
void write_image(const fs::path& p, const State& s) {
  const Checkpoint c = checkpoint_of(s);
  write_checkpoint(p, checkpoint::make_replica_image(c, kPlan));
}

TEST(ReplicaOnDisk, SectionsLeftInTheFileDecodeAsTheImageInMemory) {
  testing::TempDir dir;
  const State s = state();
  const fs::path p = dir.path() / "image.fwck";
  write_image(p, s);
  const Checkpoint whole = read_checkpoint(p);
  const Checkpoint on_disk = read_checkpoint(p, {}, {checkpoint::kRestoreOnDiskFrom});
  ASSERT_TRUE(on_disk.find("optimizer")->on_disk());
  ASSERT_TRUE(on_disk.find("held")->on_disk());
  EXPECT_GT(on_disk.find("optimizer")->size(), 2 * checkpoint::kRestoreOnDiskFrom * 4);
  EXPECT_EQ(checkpoint::replica_section_names(on_disk),
            (std::vector<std::string>{"params", "residual", "held", "optimizer", "empty"}));
  for (const std::string name : {"params", "residual", "held", "optimizer", "empty"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(decoded(on_disk, name, s), decoded(whole, name, s));
  }
  // Bit for bit where the image is lossless.
  const std::vector<uint8_t> params = decoded(on_disk, "params", s);
  EXPECT_EQ(std::memcmp(params.data(), s.params.data(), params.size()), 0);
  const std::vector<uint8_t> held = decoded(on_disk, "held", s);
  EXPECT_EQ(std::memcmp(held.data(), s.held.data(), held.size()), 0);
  EXPECT_EQ(decoded(on_disk, "optimizer", s), s.blob);
  EXPECT_TRUE(decoded(on_disk, "empty", s).empty());
  // The whole expansion reads the same.
  const Checkpoint back = checkpoint::expand_replica_image(on_disk, s.anchor.data(), kN);
  EXPECT_EQ(back.find("optimizer")->bytes, s.blob);
}

TEST(ReplicaOnDisk, BytesChangedInTheFileAfterTheReadAreRefusedNamingTheSection) {
  testing::TempDir dir;
  const State s = state();
  const fs::path p = dir.path() / "image.fwck";
  write_image(p, s);
  const Checkpoint on_disk = read_checkpoint(p, {}, {checkpoint::kRestoreOnDiskFrom});
  // The last bytes of the residual: its low plane, stored raw, which only
  // the section's digest covers.
  const std::vector<uint8_t> residual = read_checkpoint(p).find("residual")->bytes;
  const std::vector<uint8_t> file = testing::slurp(p);
  const auto at = std::search(file.begin(), file.end(), residual.end() - 64, residual.end());
  ASSERT_NE(at, file.end());
  {
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(at - file.begin() + 63);
    const char flipped = static_cast<char>(residual.back() ^ 0x5a);
    f.write(&flipped, 1);
  }
  const std::string msg = testing::crypto_error([&] { (void)decoded(on_disk, "residual", s); });
  EXPECT_NE(msg.find("section 'residual' changed on disk"), std::string::npos) << msg;
  // The others still decode.
  EXPECT_EQ(decoded(on_disk, "optimizer", s), s.blob);
}

// A section one byte longer than its frame (and its low plane) or one byte
// short is refused, wherever it is read from.
TEST(ReplicaOnDisk, ASectionLongerOrShorterThanItsFrameIsRefused) {
  testing::TempDir dir;
  const State s = state();
  const Checkpoint c = checkpoint_of(s);
  Checkpoint image = checkpoint::make_replica_image(c, kPlan);
  materialize(image);
  for (const std::string name : {"params", "residual", "held", "optimizer"}) {
    for (const int change : {+1, -1}) {
      SCOPED_TRACE(name + (change > 0 ? " longer" : " shorter"));
      Checkpoint bad = image;
      for (CheckpointSection& sec : bad.sections) {
        if (sec.name != name) continue;
        if (change > 0) {
          sec.bytes.push_back(0);
        } else {
          sec.bytes.pop_back();
        }
      }
      const fs::path p = dir.path() / "bad.fwck";
      write_checkpoint(p, bad);
      for (const uint64_t from : {UINT64_MAX, uint64_t{1}}) {
        const Checkpoint read = read_checkpoint(p, {}, {from});
        EXPECT_NE(testing::crypto_error([&] { (void)decoded(read, name, s); }), "") << from;
      }
    }
  }
}

}  // namespace
}  // namespace fedwan
