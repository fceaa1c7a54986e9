// Sections a checkpoint read leaves in its file (CheckpointReadOptions):
// a restore reads the model straight into place instead of holding the
// file's bytes and a copy beside. What recovery relies on: the bytes read
// later are the bytes verified, or a CryptoError; every damaged file is
// refused as without the option; a file replaced meanwhile changes nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/checkpoint_meta.hpp"
#include "checkpoint/node_checkpoint.hpp"
#include "fedwan/error.hpp"
#include "harness/error_message.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;
using Dir = fedwan::testing::TempDir;

constexpr uint64_t kFrom = 1024;  // sections of 1 KiB or more stay on disk
constexpr size_t kMiB = size_t{1} << 20;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
  return v;
}

// Overwrites one byte of `p` in place (same inode, as an editor of the disk
// would, not the atomic replace a writer does).
void flip_in_place(const fs::path& p, uint64_t offset) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&b, 1);
}

// A model-sized section over several read pieces (4 MiB each), a small one,
// an empty one and a meta.
Checkpoint model_checkpoint() {
  Checkpoint c;
  c.round = 7;
  c.node_id = "site-a";
  c.sections.push_back({"params", pattern(9 * kMiB + 12, 3)});
  c.sections.push_back({"small", {1, 2, 3}});
  c.sections.push_back({"empty", {}});
  c.sections.push_back({"residual.bf16", pattern(3000, 9)});
  const std::string meta = R"({"data_position":42})";
  c.sections.push_back({"meta", std::vector<uint8_t>(meta.begin(), meta.end())});
  return c;
}

TEST(CheckpointOnDisk, LargeSectionsStayInTheFileAndReadBackExactly) {
  Dir d;
  const Checkpoint original = model_checkpoint();
  write_checkpoint(d / "c.fwck", original);
  const Checkpoint c = read_checkpoint(d / "c.fwck", {}, {kFrom});
  ASSERT_EQ(c.sections.size(), original.sections.size());
  for (size_t i = 0; i < c.sections.size(); ++i) {
    const CheckpointSection& s = c.sections[i];
    SCOPED_TRACE(s.name);
    const bool large = original.sections[i].bytes.size() >= kFrom;
    EXPECT_EQ(s.on_disk(), large);
    EXPECT_EQ(s.size(), original.sections[i].bytes.size());
    if (large) {
      EXPECT_TRUE(s.bytes.empty()) << "no copy in memory";
      EXPECT_THROW((void)s.data(), std::logic_error);
    }
    EXPECT_EQ(section_bytes(s), original.sections[i].bytes);
    std::vector<uint8_t> into(s.size() + 1, 0xEE);
    read_section(s, into.data());
    EXPECT_EQ(into.back(), 0xEE) << "nothing past the section";
    into.pop_back();
    EXPECT_EQ(into, original.sections[i].bytes);
  }
  EXPECT_EQ(checkpoint::checkpoint_meta(c).value("data_position", 0), 42);
}

TEST(CheckpointOnDisk, StreamedPiecesAreWholeMultiplesOfFourMiB) {
  Dir d;
  write_checkpoint(d / "c.fwck", model_checkpoint());
  const Checkpoint c = read_checkpoint(d / "c.fwck", {}, {kFrom});
  std::vector<size_t> pieces;
  std::vector<uint8_t> joined;
  stream_section(*c.find("params"), [&](const uint8_t* data, size_t n) {
    pieces.push_back(n);
    joined.insert(joined.end(), data, data + n);
  });
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0], 4 * kMiB);
  EXPECT_EQ(pieces[1], 4 * kMiB);
  EXPECT_EQ(pieces[2], kMiB + 12);
  EXPECT_EQ(joined, model_checkpoint().sections[0].bytes);
}

TEST(CheckpointOnDisk, EveryDamagedFileIsStillRefusedWhenItIsRead) {
  Dir d;
  Checkpoint c;
  c.node_id = "root";
  c.sections.push_back({"held", pattern(5000, 1)});
  c.sections.push_back({"meta", {'{', '}'}});
  write_checkpoint(d / "good", c);
  const std::vector<uint8_t> good = testing::slurp(d / "good");
  // Every byte of the header, the manifest and the trailer, and a stride
  // through the section bytes.
  for (size_t off = 0; off < good.size(); off += (off < 200 || off + 200 > good.size()) ? 1 : 97) {
    std::vector<uint8_t> f = good;
    f[off] ^= 0x01;
    testing::spit(d / "bad", f);
    EXPECT_THROW(read_checkpoint(d / "bad", {}, {1}), CryptoError) << "offset " << off;
  }
  for (size_t n : {size_t{0}, size_t{60}, good.size() / 2, good.size() - 1}) {
    testing::spit(d / "bad",
                  std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(n)));
    EXPECT_THROW(read_checkpoint(d / "bad", {}, {1}), CryptoError) << "length " << n;
  }
}

TEST(CheckpointOnDisk, BytesChangedAfterTheReadAreRefusedNamingTheSection) {
  Dir d;
  const fs::path p = d / "c.fwck";
  write_checkpoint(p, model_checkpoint());
  const Checkpoint c = read_checkpoint(p, {}, {kFrom});
  const std::vector<uint8_t> file = testing::slurp(p);
  // The last byte of "params": 8 MiB into it, past the first two pieces.
  const std::vector<uint8_t> params = model_checkpoint().sections[0].bytes;
  const auto at = std::search(file.begin(), file.end(), params.end() - 64, params.end());
  ASSERT_NE(at, file.end());
  flip_in_place(p, static_cast<uint64_t>(at - file.begin()) + 63);
  const std::string msg = testing::crypto_error([&] { (void)section_bytes(*c.find("params")); });
  EXPECT_NE(msg.find("section 'params' changed on disk"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  // The sections left alone still read.
  EXPECT_EQ(section_bytes(*c.find("residual.bf16")), model_checkpoint().sections[3].bytes);
  // A copy of the changed file is not made either.
  EXPECT_NE(testing::crypto_error([&] { write_checkpoint(d / "copy.fwck", c); }), "");
  EXPECT_FALSE(fs::exists(d / "copy.fwck"));
}

TEST(CheckpointOnDisk, ATruncatedFileIsRefusedNotReadPastItsEnd) {
  Dir d;
  const fs::path p = d / "c.fwck";
  write_checkpoint(p, model_checkpoint());
  const Checkpoint c = read_checkpoint(p, {}, {kFrom});
  ASSERT_EQ(::truncate(p.c_str(), 5 * kMiB), 0);
  const std::string msg = testing::crypto_error([&] { (void)section_bytes(*c.find("params")); });
  EXPECT_NE(msg.find("section 'params' ends early"), std::string::npos) << msg;
  EXPECT_NE(testing::crypto_error([&] { (void)section_bytes(*c.find("residual.bf16")); }), "");
}

TEST(CheckpointOnDisk, AFileReplacedOrRenamedAfterTheReadChangesNothing) {
  Dir d;
  const fs::path p = d / "c.fwck";
  const Checkpoint original = model_checkpoint();
  write_checkpoint(p, original);
  const Checkpoint c = read_checkpoint(p, {}, {kFrom});
  // What a node's next checkpoint does: the old one renamed aside, a new
  // one written in its place; then the old one deleted.
  fs::rename(p, d / "c.prev.fwck");
  Checkpoint next = model_checkpoint();
  next.sections[0].bytes = pattern(next.sections[0].bytes.size(), 77);
  write_checkpoint(p, next);
  fs::remove(d / "c.prev.fwck");
  EXPECT_EQ(section_bytes(*c.find("params")), original.sections[0].bytes);
}

TEST(CheckpointOnDisk, WrittenAgainAndMaterializedTheyAreTheSameCheckpoint) {
  Dir d;
  const Checkpoint original = model_checkpoint();
  write_checkpoint(d / "a.fwck", original);
  Checkpoint c = read_checkpoint(d / "a.fwck", {}, {kFrom});
  write_checkpoint(d / "b.fwck", c);
  EXPECT_EQ(testing::slurp(d / "a.fwck"), testing::slurp(d / "b.fwck"));
  materialize(c);
  for (size_t i = 0; i < c.sections.size(); ++i) {
    EXPECT_FALSE(c.sections[i].on_disk());
    EXPECT_EQ(c.sections[i].bytes, original.sections[i].bytes) << c.sections[i].name;
  }
}

TEST(CheckpointOnDisk, FloatSectionsAreCopiedStraightIntoTheCallersBuffer) {
  Dir d;
  std::vector<float> values(3000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 7.0f;
  Checkpoint c;
  c.node_id = "root";
  c.sections.push_back(checkpoint::float_section("held", values.data(), values.size()));
  write_checkpoint(d / "c.fwck", c);
  const Checkpoint read = read_checkpoint(d / "c.fwck", {}, {kFrom});
  ASSERT_TRUE(read.find("held")->on_disk());
  std::vector<float> out(values.size(), 1.0f);
  checkpoint::copy_floats(read, "held", out.data(), out.size());
  EXPECT_EQ(out, values);
  EXPECT_EQ(checkpoint::floats_of(read, "held", values.size()), values);
  // The wrong length is refused before anything is written.
  std::vector<float> shorter(values.size() - 1, 1.0f);
  EXPECT_THROW(checkpoint::copy_floats(read, "held", shorter.data(), shorter.size()), CryptoError);
  EXPECT_EQ(shorter, std::vector<float>(values.size() - 1, 1.0f));
}

}  // namespace
}  // namespace fedwan
