// Checkpoint replication (checkpoint/replica_store.hpp): what recovery relies on
// is that a replica read back is exactly the checkpoint the child wrote, that
// nothing damaged, foreign or half-received is ever stored or installed, and
// that a bad transfer never destroys a good file already there.
#include "checkpoint/replica_store.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "harness/temp_dir.hpp"

namespace fedwan::checkpoint {
namespace {

namespace fs = std::filesystem;
using Kind = ReplicaStore::Result::Kind;

using fedwan::testing::slurp;
using fedwan::testing::spit;
using fedwan::testing::TempDir;
using fedwan::testing::entries;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::array<uint8_t, 32> topology(uint8_t seed) {
  std::array<uint8_t, 32> d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(seed + i);
  return d;
}

Checkpoint make_checkpoint(const std::string& node, uint64_t round, size_t param_bytes = 1000,
                           uint8_t topo_seed = 0xa0) {
  Checkpoint c;
  c.round = round;
  c.topology_digest = topology(topo_seed);
  c.node_id = node;
  std::vector<uint8_t> params(param_bytes);
  std::mt19937 rng(static_cast<uint32_t>(round * 31 + param_bytes));
  for (auto& b : params) b = static_cast<uint8_t>(rng());
  c.sections.push_back({"params", std::move(params)});
  c.sections.push_back({"outer.opt-state", {1, 2, 3}});
  return c;
}

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.round, b.round);
  EXPECT_EQ(a.topology_digest, b.topology_digest);
  EXPECT_EQ(a.node_id, b.node_id);
  ASSERT_EQ(a.sections.size(), b.sections.size());
  for (size_t i = 0; i < a.sections.size(); ++i) {
    EXPECT_EQ(a.sections[i].name, b.sections[i].name);
    EXPECT_TRUE(a.sections[i].bytes == b.sections[i].bytes) << a.sections[i].name;
  }
}

// Sends `bytes` as `child`'s round `round` in pieces of `piece`, announcing
// `total` (the true size unless given). Every piece before the last must be
// kPartial; returns the last piece's result.
ReplicaStore::Result send(ReplicaStore& store, const std::string& child, uint64_t round,
                          const std::vector<uint8_t>& bytes, size_t piece = 97,
                          uint64_t total = 0) {
  if (total == 0) total = bytes.size();
  const auto count = static_cast<uint32_t>((bytes.size() + piece - 1) / piece);
  ReplicaStore::Result r;
  for (uint32_t i = 0; i < count; ++i) {
    const size_t off = size_t{i} * piece;
    r = store.add_piece(child, round, i, count, total, bytes.data() + off,
                        std::min(piece, bytes.size() - off));
    if (i + 1 < count) {
      EXPECT_EQ(r.kind, Kind::kPartial) << "piece " << i << ": " << r.detail;
      if (r.kind != Kind::kPartial) return r;
      EXPECT_EQ(r.bytes, off + piece);
    }
  }
  return r;
}

// Writes `c` to <scratch>/<name> and returns the file's bytes.
std::vector<uint8_t> checkpoint_bytes(const TempDir& scratch, const Checkpoint& c,
                                      const std::string& name = "src.fwck") {
  write_checkpoint(scratch / name, c);
  return slurp(scratch / name);
}

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 0777;
}

TEST(ReplicaStore, RoundTripsThroughPieceReaderAndLatest) {
  TempDir d;
  const Checkpoint original = make_checkpoint("site-a", 7, 5000);
  write_checkpoint(d / "site-a.fwck", original);
  const std::vector<uint8_t> file = slurp(d / "site-a.fwck");

  PieceReader reader(d / "site-a.fwck", 256);
  EXPECT_EQ(reader.size(), file.size());
  EXPECT_EQ(reader.count(), (file.size() + 255) / 256);

  ReplicaStore store(d / "replicas", original.topology_digest);
  ReplicaStore::Result r;
  while (!reader.done()) {
    const uint32_t index = reader.next_index();
    const std::vector<uint8_t> piece = reader.next();
    r = store.add_piece("site-a", 7, index, reader.count(), reader.size(), piece.data(),
                        piece.size());
    if (!reader.done()) ASSERT_EQ(r.kind, Kind::kPartial) << r.detail;
  }
  ASSERT_EQ(r.kind, Kind::kStored) << r.detail;
  EXPECT_EQ(r.round, 7u);
  EXPECT_EQ(r.bytes, file.size());
  // The checkpoint's digest: an unsigned file's trailer is that digest.
  ASSERT_GE(file.size(), 32u);
  EXPECT_EQ(r.digest_hex, to_hex(file.data() + file.size() - 32, 32));
  CheckpointIdentity id;
  ASSERT_EQ(check_checkpoint_integrity(r.path, &id), std::nullopt);
  EXPECT_EQ(r.digest_hex, to_hex(id.digest.data(), id.digest.size()));
  EXPECT_EQ(r.path, d / "replicas" / "site-a" / "round-7.fwck");
  // No temporary file left beside it; private modes.
  EXPECT_EQ(entries(d / "replicas" / "site-a"), std::vector<std::string>{"round-7.fwck"});
  EXPECT_EQ(mode_of(r.path), 0600u);
  EXPECT_EQ(mode_of(d / "replicas" / "site-a"), 0700u);
  EXPECT_EQ(mode_of(d / "replicas"), 0700u);

  const std::optional<fs::path> latest = store.latest("site-a");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, r.path);
  expect_same(read_checkpoint(*latest), original);
  EXPECT_FALSE(store.latest("site-b").has_value());
}

TEST(ReplicaStore, KeepsTheNewestTwoOverFourRounds) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0), 2);
  for (uint64_t round = 1; round <= 4; ++round) {
    const ReplicaStore::Result r =
        send(store, "site-a", round, checkpoint_bytes(d, make_checkpoint("site-a", round)));
    ASSERT_EQ(r.kind, Kind::kStored) << r.detail;
    const std::vector<uint64_t> want =
        round == 1 ? std::vector<uint64_t>{1} : std::vector<uint64_t>{round - 1, round};
    EXPECT_EQ(store.rounds("site-a"), want);
  }
  EXPECT_EQ(entries(d / "replicas" / "site-a"),
            (std::vector<std::string>{"round-3.fwck", "round-4.fwck"}));
  EXPECT_EQ(read_checkpoint(*store.latest("site-a")).round, 4u);

  // A round older than both kept would be pruned at once: refused up front.
  const std::vector<uint8_t> two = checkpoint_bytes(d, make_checkpoint("site-a", 2));
  const ReplicaStore::Result stale =
      store.add_piece("site-a", 2, 0, 1, two.size(), two.data(), two.size());
  EXPECT_EQ(stale.kind, Kind::kRefused);
  EXPECT_TRUE(contains(stale.detail, "older")) << stale.detail;
  EXPECT_EQ(store.rounds("site-a"), (std::vector<uint64_t>{3, 4}));
}

TEST(ReplicaStore, ReplacesAReplicaOfTheSameRound) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  const Checkpoint first = make_checkpoint("site-a", 5, 800);
  const Checkpoint second = make_checkpoint("site-a", 5, 1200);
  ASSERT_EQ(send(store, "site-a", 5, checkpoint_bytes(d, first)).kind, Kind::kStored);
  const ReplicaStore::Result r = send(store, "site-a", 5, checkpoint_bytes(d, second));
  ASSERT_EQ(r.kind, Kind::kStored) << r.detail;
  EXPECT_EQ(store.rounds("site-a"), std::vector<uint64_t>{5});
  expect_same(read_checkpoint(r.path), second);
}

TEST(ReplicaStore, OutOfOrderPieceIsRefusedAndTheAssemblyDropped) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  const std::vector<uint8_t> file = checkpoint_bytes(d, make_checkpoint("site-a", 3));
  const auto count = static_cast<uint32_t>((file.size() + 99) / 100);
  ASSERT_GE(count, 4u);

  EXPECT_EQ(store.add_piece("site-a", 3, 0, count, file.size(), file.data(), 100).kind,
            Kind::kPartial);
  const ReplicaStore::Result skip =
      store.add_piece("site-a", 3, 2, count, file.size(), file.data() + 200, 100);
  EXPECT_EQ(skip.kind, Kind::kRefused);
  EXPECT_TRUE(contains(skip.detail, "expected piece 1")) << skip.detail;
  // The assembly is gone: the piece it was waiting for no longer fits.
  const ReplicaStore::Result late =
      store.add_piece("site-a", 3, 1, count, file.size(), file.data() + 100, 100);
  EXPECT_EQ(late.kind, Kind::kRefused);
  EXPECT_TRUE(contains(late.detail, "no transfer in progress")) << late.detail;
  EXPECT_TRUE(entries(d / "replicas" / "site-a").empty());  // temporary removed

  // Abandon drops an unfinished one the same way.
  EXPECT_EQ(store.add_piece("site-a", 3, 0, count, file.size(), file.data(), 100).kind,
            Kind::kPartial);
  store.abandon("site-a");
  EXPECT_EQ(store.add_piece("site-a", 3, 1, count, file.size(), file.data() + 100, 100).kind,
            Kind::kRefused);

  // A fresh piece 0 starts over, also over an unfinished transfer.
  EXPECT_EQ(store.add_piece("site-a", 3, 0, count, file.size(), file.data(), 100).kind,
            Kind::kPartial);
  const ReplicaStore::Result r = send(store, "site-a", 3, file, 100);
  ASSERT_EQ(r.kind, Kind::kStored) << r.detail;
  EXPECT_EQ(entries(d / "replicas" / "site-a"), std::vector<std::string>{"round-3.fwck"});
}

TEST(ReplicaStore, SizesThatDoNotAddUpAreRefused) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  const std::vector<uint8_t> file = checkpoint_bytes(d, make_checkpoint("site-a", 3));

  // Announced one byte more than sent: the last piece comes up short.
  ReplicaStore::Result r = send(store, "site-a", 3, file, 100, file.size() + 1);
  EXPECT_EQ(r.kind, Kind::kRefused);
  EXPECT_TRUE(contains(r.detail, "announced as " + std::to_string(file.size() + 1))) << r.detail;

  // Announced one byte less: a piece overflows it.
  r = send(store, "site-a", 3, file, 100, file.size() - 1);
  EXPECT_EQ(r.kind, Kind::kRefused);

  // A piece announcing another total, count or round than piece 0.
  const auto count = static_cast<uint32_t>((file.size() + 99) / 100);
  for (int variant = 0; variant < 3; ++variant) {
    ASSERT_EQ(store.add_piece("site-a", 3, 0, count, file.size(), file.data(), 100).kind,
              Kind::kPartial);
    r = store.add_piece("site-a", variant == 2 ? 4 : 3, 1, variant == 1 ? count + 1 : count,
                        variant == 0 ? file.size() + 5 : file.size(), file.data() + 100, 100);
    EXPECT_EQ(r.kind, Kind::kRefused) << variant;
    EXPECT_TRUE(contains(r.detail, "announces")) << r.detail;
  }
  // An empty piece, and more pieces than bytes.
  ASSERT_EQ(store.add_piece("site-a", 3, 0, count, file.size(), file.data(), 100).kind,
            Kind::kPartial);
  EXPECT_EQ(store.add_piece("site-a", 3, 1, count, file.size(), file.data(), 0).kind,
            Kind::kRefused);
  EXPECT_EQ(store.add_piece("site-a", 3, 0, 10, 5, file.data(), 1).kind, Kind::kRefused);

  EXPECT_TRUE(store.rounds("site-a").empty());
  EXPECT_TRUE(entries(d / "replicas" / "site-a").empty());
}

TEST(ReplicaStore, AnotherNodesTopologysOrRoundsFileIsRefusedAndNotKept) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  const Checkpoint good = make_checkpoint("site-a", 6);
  ASSERT_EQ(send(store, "site-a", 6, checkpoint_bytes(d, good)).kind, Kind::kStored);

  ReplicaStore::Result r =
      send(store, "site-a", 6, checkpoint_bytes(d, make_checkpoint("site-b", 6)));
  EXPECT_EQ(r.kind, Kind::kRefused);
  EXPECT_TRUE(contains(r.detail, "'site-b'")) << r.detail;

  r = send(store, "site-a", 6, checkpoint_bytes(d, make_checkpoint("site-a", 6, 1000, 0x10)));
  EXPECT_EQ(r.kind, Kind::kRefused);
  EXPECT_TRUE(contains(r.detail, "topology")) << r.detail;

  r = send(store, "site-a", 6, checkpoint_bytes(d, make_checkpoint("site-a", 9)));
  EXPECT_EQ(r.kind, Kind::kRefused);
  EXPECT_TRUE(contains(r.detail, "round 9")) << r.detail;

  // Each refused file is gone and the good replica of that round untouched.
  EXPECT_EQ(entries(d / "replicas" / "site-a"), std::vector<std::string>{"round-6.fwck"});
  expect_same(read_checkpoint(d / "replicas" / "site-a" / "round-6.fwck"), good);
}

TEST(ReplicaStore, ACorruptedByteAnywhereIsRefused) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  const std::vector<uint8_t> file = checkpoint_bytes(d, make_checkpoint("site-a", 2, 40));
  for (size_t at = 0; at < file.size(); ++at) {
    std::vector<uint8_t> bad = file;
    bad[at] ^= 0x01;
    const ReplicaStore::Result r = send(store, "site-a", 2, bad, 64);
    EXPECT_EQ(r.kind, Kind::kRefused) << "byte " << at;
  }
  EXPECT_TRUE(entries(d / "replicas" / "site-a").empty());
  EXPECT_EQ(send(store, "site-a", 2, file, 64).kind, Kind::kStored);
}

TEST(ReplicaStore, LatestSkipsAndRenamesACorruptReplica) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  for (uint64_t round : {1, 2}) {
    ASSERT_EQ(
        send(store, "site-a", round, checkpoint_bytes(d, make_checkpoint("site-a", round))).kind,
        Kind::kStored);
  }
  const fs::path dir = d / "replicas" / "site-a";
  std::vector<uint8_t> bytes = slurp(dir / "round-2.fwck");
  bytes[bytes.size() / 2] ^= 0x80;
  spit(dir / "round-2.fwck", bytes);

  std::optional<fs::path> latest = store.latest("site-a");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, dir / "round-1.fwck");
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"round-1.fwck", "round-2.fwck.corrupt"}));
  EXPECT_EQ(store.rounds("site-a"), std::vector<uint64_t>{1});

  // A replica whose content is intact but another round than its name says.
  fs::copy_file(dir / "round-1.fwck", dir / "round-3.fwck");
  EXPECT_EQ(store.latest("site-a"), std::optional<fs::path>(dir / "round-1.fwck"));
  EXPECT_TRUE(fs::exists(dir / "round-3.fwck.corrupt"));

  spit(dir / "round-1.fwck", {'F', 'W', 'C', 'K'});
  EXPECT_FALSE(store.latest("site-a").has_value());
  EXPECT_TRUE(store.rounds("site-a").empty());
}

TEST(ReplicaStore, InvalidChildIdIsRefused) {
  TempDir d;
  ReplicaStore store(d / "replicas", topology(0xa0));
  const std::vector<uint8_t> file = checkpoint_bytes(d, make_checkpoint("x", 1));
  for (const std::string& child :
       std::vector<std::string>{"../x", "a/b", "", std::string(65, 'a')}) {
    const ReplicaStore::Result r = send(store, child, 1, file, file.size());
    EXPECT_EQ(r.kind, Kind::kRefused) << child;
    EXPECT_TRUE(contains(r.detail, "node id")) << r.detail;
    EXPECT_TRUE(store.rounds(child).empty());
    EXPECT_FALSE(store.latest(child).has_value());
  }
  EXPECT_FALSE(fs::exists(d / "x"));
  EXPECT_FALSE(fs::exists(d / "replicas"));
  EXPECT_THROW(ReplicaStore(d / "r2", topology(0), 0), ConfigError);
}

TEST(ReplicaPieceReader, KeepsReadingTheOldFileAfterThePathIsReplaced) {
  TempDir d;
  const std::vector<uint8_t> old_bytes =
      checkpoint_bytes(d, make_checkpoint("site-a", 1, 3000), "c.fwck");
  PieceReader reader(d / "c.fwck", 1000);
  ASSERT_EQ(reader.count(), (old_bytes.size() + 999) / 1000);
  std::vector<uint8_t> got = reader.next();
  EXPECT_EQ(got.size(), 1000u);
  EXPECT_EQ(reader.next_index(), 1u);

  write_checkpoint(d / "c.fwck", make_checkpoint("site-a", 2, 9000));  // rename over the path
  ASSERT_NE(slurp(d / "c.fwck"), old_bytes);
  while (!reader.done()) {
    const std::vector<uint8_t> piece = reader.next();
    EXPECT_LE(piece.size(), 1000u);
    got.insert(got.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(got, old_bytes);
  EXPECT_THROW(reader.next(), TransportError);
}

TEST(ReplicaPieceReader, RefusesMissingEmptyOrUnsplittableFiles) {
  TempDir d;
  try {
    PieceReader reader(d / "absent.fwck", 10);
    ADD_FAILURE() << "opened a missing file";
  } catch (const TransportError& e) {
    EXPECT_TRUE(contains(e.what(), (d / "absent.fwck").string())) << e.what();
  }
  spit(d / "empty", {});
  EXPECT_THROW(PieceReader(d / "empty", 10), TransportError);
  EXPECT_THROW(PieceReader(d.path(), 10), TransportError);
  spit(d / "one", {42});
  EXPECT_THROW(PieceReader(d / "one", 0), ConfigError);
  PieceReader one(d / "one", 10);
  EXPECT_EQ(one.count(), 1u);
  EXPECT_EQ(one.next(), std::vector<uint8_t>{42});
  EXPECT_TRUE(one.done());
}

TEST(ReplicaAssembly, InstallsAReplicaAsTheLocalCheckpoint) {
  TempDir d;
  const Checkpoint original = make_checkpoint("site-a", 11, 4000);
  const std::vector<uint8_t> file = checkpoint_bytes(d, original, "replica.fwck");
  const fs::path target = d / "site-a.fwck";
  spit(target, {'j', 'u', 'n', 'k'});  // the damaged local checkpoint

  PieceReader reader(d / "replica.fwck", 512);
  CheckpointAssembly a(target, "site-a", original.topology_digest, 11, reader.count(),
                       reader.size());
  std::string why;
  CheckpointAssembly::Status st = CheckpointAssembly::Status::kMore;
  while (!reader.done()) {
    const uint32_t index = reader.next_index();
    const std::vector<uint8_t> piece = reader.next();
    st = a.add(index, reader.count(), 11, reader.size(), piece.data(), piece.size(), &why);
    if (!reader.done()) {
      ASSERT_EQ(st, CheckpointAssembly::Status::kMore) << why;
      EXPECT_EQ(slurp(target).size(), 4u);  // untouched until complete
    }
  }
  ASSERT_EQ(st, CheckpointAssembly::Status::kDone) << why;
  EXPECT_EQ(a.round(), 11u);
  EXPECT_EQ(a.received(), file.size());
  EXPECT_EQ(a.digest_hex(), to_hex(file.data() + file.size() - 32, 32));
  expect_same(read_checkpoint(target), original);
  EXPECT_EQ(mode_of(target), 0600u);
  EXPECT_EQ(a.add(0, reader.count(), 11, reader.size(), file.data(), 1, &why),
            CheckpointAssembly::Status::kFailed);
  EXPECT_TRUE(contains(why, "already complete")) << why;

  // A transfer that fails verification leaves the installed file alone.
  std::vector<uint8_t> bad = file;
  bad.back() ^= 1;
  CheckpointAssembly b(target, "site-a", original.topology_digest, 11, 1, bad.size());
  EXPECT_EQ(b.add(0, 1, 11, bad.size(), bad.data(), bad.size(), &why),
            CheckpointAssembly::Status::kFailed);
  EXPECT_TRUE(contains(why, "digest mismatch")) << why;
  EXPECT_TRUE(contains(why, target.string())) << why;
  EXPECT_TRUE(b.digest_hex().empty());
  expect_same(read_checkpoint(target), original);
  EXPECT_EQ(entries(d.path()), (std::vector<std::string>{"replica.fwck", "site-a.fwck"}));

  // A target whose directory is missing is a failure, not an exception.
  CheckpointAssembly c(d / "missing" / "x.fwck", "site-a", original.topology_digest, 11, 1,
                       file.size());
  EXPECT_EQ(c.add(0, 1, 11, file.size(), file.data(), file.size(), &why),
            CheckpointAssembly::Status::kFailed);
  EXPECT_FALSE(why.empty());
}

TEST(ReplicaStreamCheck, ReportsTruncatedGarbageAndForeignFiles) {
  TempDir d;
  const Checkpoint c = make_checkpoint("site-a", 4, 300);
  const std::vector<uint8_t> file = checkpoint_bytes(d, c, "good.fwck");
  const fs::path p = d / "t.fwck";

  CheckpointIdentity id;
  EXPECT_EQ(check_checkpoint_stream(d / "good.fwck", "site-a", c.topology_digest, &id),
            std::nullopt);
  EXPECT_EQ(id.round, 4u);
  EXPECT_EQ(id.node_id, "site-a");
  EXPECT_EQ(id.topology_digest, c.topology_digest);

  const auto reason = [&](const std::string& node = "site-a", uint8_t seed = 0xa0) {
    std::optional<std::string> r = check_checkpoint_stream(p, node, topology(seed));
    EXPECT_TRUE(r.has_value());
    if (r) EXPECT_TRUE(contains(*r, p.string())) << *r;
    return r.value_or("");
  };
  for (size_t len : {size_t{0}, size_t{3}, size_t{40}, size_t{60}}) {
    spit(p, std::vector<uint8_t>(file.begin(), file.begin() + len));
    EXPECT_TRUE(contains(reason(), "too short")) << len;
  }
  for (size_t len : {size_t{100}, file.size() - 1}) {
    spit(p, std::vector<uint8_t>(file.begin(), file.begin() + len));
    EXPECT_TRUE(contains(reason(), "truncated")) << len;
  }
  std::vector<uint8_t> longer = file;
  longer.push_back(0);
  spit(p, longer);
  EXPECT_TRUE(contains(reason(), "after the trailer"));
  std::vector<uint8_t> flipped = file;
  flipped[file.size() - 40] ^= 1;  // the last section's bytes
  spit(p, flipped);
  EXPECT_TRUE(contains(reason(), "digest mismatch"));
  flipped = file;
  flipped[60] ^= 1;  // the manifest
  spit(p, flipped);
  EXPECT_FALSE(reason().empty());

  std::vector<uint8_t> garbage(500);
  std::mt19937 rng(3);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  spit(p, garbage);
  EXPECT_TRUE(contains(reason(), "bad magic"));

  std::vector<uint8_t> v4 = file;
  v4[4] = 4;
  spit(p, v4);
  EXPECT_TRUE(contains(reason(), "version 4"));

  spit(p, file);
  EXPECT_TRUE(contains(reason("site-b"), "not 'site-b'"));
  EXPECT_TRUE(contains(reason("site-a", 0x11), "topology"));
  fs::remove(p);
  EXPECT_TRUE(contains(reason(), "cannot open"));
}

TEST(ReplicaStreamCheck, TheIntegrityCheckNamesAnyNodesCheckpointByItsDigest) {
  TempDir d;
  const Checkpoint c = make_checkpoint("site-b", 6, 3000, 0xb3);
  const std::vector<uint8_t> file = checkpoint_bytes(d, c, "b.fwck");
  CheckpointIdentity id;
  ASSERT_EQ(check_checkpoint_integrity(d / "b.fwck", &id), std::nullopt);
  EXPECT_EQ(id.node_id, "site-b");
  EXPECT_EQ(id.round, 6u);
  EXPECT_EQ(id.topology_digest, c.topology_digest);
  // An unsigned file's trailer is its digest; not the whole file's SHA-256.
  EXPECT_EQ(to_hex(id.digest.data(), 32), to_hex(file.data() + file.size() - 32, 32));
  const Sha256Digest whole = sha256(file.data(), file.size());
  EXPECT_NE(id.digest, whole);
  // The checked identity agrees.
  CheckpointIdentity checked;
  ASSERT_EQ(check_checkpoint_stream(d / "b.fwck", "site-b", c.topology_digest, &checked),
            std::nullopt);
  EXPECT_EQ(checked.digest, id.digest);

  // One value of a section otherwise: another digest.
  Checkpoint other = c;
  other.sections[0].bytes[17] ^= 1;
  checkpoint_bytes(d, other, "other.fwck");
  CheckpointIdentity other_id;
  ASSERT_EQ(check_checkpoint_integrity(d / "other.fwck", &other_id), std::nullopt);
  EXPECT_NE(other_id.digest, id.digest);

  // A byte changed in the file is found, not named by a digest.
  std::vector<uint8_t> flipped = file;
  flipped[file.size() - 40] ^= 1;
  spit(d / "flipped.fwck", flipped);
  const std::optional<std::string> bad = check_checkpoint_integrity(d / "flipped.fwck", &id);
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(contains(*bad, "digest mismatch")) << *bad;
  EXPECT_TRUE(check_checkpoint_integrity(d / "missing.fwck", &id).has_value());
}

}  // namespace
}  // namespace fedwan::checkpoint
