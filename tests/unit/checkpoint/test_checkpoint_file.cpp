// The checkpoint container (checkpoint/checkpoint_file.hpp): what recovery
// relies on is that a checkpoint read back is exactly the one written, and
// that any damaged or foreign file is refused with a CryptoError.
#include "checkpoint/checkpoint_file.hpp"
#include "harness/error_message.hpp"
#include "harness/temp_dir.hpp"

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

#include "fedwan/error.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;

using fedwan::testing::slurp;
using fedwan::testing::spit;
using fedwan::testing::TempDir;
using fedwan::testing::entries;
using fedwan::testing::error_message;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.round = 0x0102030405060708ull;
  for (size_t i = 0; i < c.topology_digest.size(); ++i) {
    c.topology_digest[i] = static_cast<uint8_t>(0xa0 + i);
  }
  c.node_id = "site-a.worker_1";
  c.sections.push_back({"params", {1, 2, 3, 4, 5, 6, 7, 8}});
  c.sections.push_back({"empty", {}});
  c.sections.push_back({"outer.opt-state", {9, 10, 11}});
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

TEST(CheckpointFile, RoundTripsSectionsIncludingEmptyAndLarge) {
  TempDir d;
  Checkpoint c = small_checkpoint();
  std::vector<uint8_t> big(size_t{20} << 20);
  std::mt19937 rng(7);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  c.sections.push_back({"model_20mib", std::move(big)});

  write_checkpoint(d / "ckpt", c);
  const Checkpoint back = read_checkpoint(d / "ckpt");
  expect_same(c, back);
  ASSERT_NE(back.find("empty"), nullptr);
  EXPECT_TRUE(back.find("empty")->bytes.empty());
  ASSERT_NE(back.find("model_20mib"), nullptr);
  EXPECT_EQ(back.find("model_20mib")->bytes.size(), size_t{20} << 20);
  EXPECT_EQ(back.find("absent"), nullptr);

  struct stat st {};
  ASSERT_EQ(::stat((d / "ckpt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// A section that views bytes held elsewhere writes the same file as one
// holding a copy of them, and reads back as bytes.
TEST(CheckpointFile, AViewedSectionWritesWhatACopyWould) {
  TempDir d;
  std::vector<uint8_t> model(size_t{3} << 20);
  std::mt19937 rng(11);
  for (auto& b : model) b = static_cast<uint8_t>(rng());
  Checkpoint copied = small_checkpoint();
  copied.sections.push_back({"model", model});
  Checkpoint viewed = small_checkpoint();
  CheckpointSection view;
  view.name = "model";
  view.view = model.data();
  view.view_size = model.size();
  viewed.sections.push_back(view);
  EXPECT_EQ(viewed.sections.back().data(), model.data());  // no copy was made
  write_checkpoint(d / "copied", copied);
  write_checkpoint(d / "viewed", viewed);
  EXPECT_EQ(slurp(d / "copied"), slurp(d / "viewed"));
  const Checkpoint back = read_checkpoint(d / "viewed");
  ASSERT_NE(back.find("model"), nullptr);
  EXPECT_EQ(back.find("model")->bytes, model);
  EXPECT_EQ(back.find("model")->view, nullptr);
}

// A section made while the file is written (a compressed image) writes the
// same file as one holding its bytes, in several sinks of any size, beside
// ordinary sections before and after it; materialize() gives the bytes.
TEST(CheckpointFile, AProducedSectionWritesWhatItsBytesWould) {
  TempDir d;
  std::vector<uint8_t> made(size_t{5} << 20);
  std::mt19937 rng(13);
  for (auto& b : made) b = static_cast<uint8_t>(rng());
  Checkpoint copied = small_checkpoint();
  copied.sections.insert(copied.sections.begin() + 1, CheckpointSection{"made", made});
  Checkpoint produced = small_checkpoint();
  CheckpointSection p;
  p.name = "made";
  int calls = 0;
  p.produce = [&made, &calls](const CheckpointSection::Sink& sink) {
    calls += 1;
    for (size_t at = 0, k = 1; at < made.size(); at += k, k = k * 3 + 1) {
      sink(made.data() + at, std::min(k, made.size() - at));
    }
  };
  produced.sections.insert(produced.sections.begin() + 1, p);
  write_checkpoint(d / "copied", copied);
  write_checkpoint(d / "produced", produced);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(slurp(d / "copied"), slurp(d / "produced"));
  expect_same(copied, read_checkpoint(d / "produced"));
  materialize(produced);
  EXPECT_EQ(calls, 2);
  expect_same(copied, produced);
  EXPECT_FALSE(produced.sections[1].produce);
}

// A producer that fails leaves the checkpoint that was there, and no
// temporary file.
TEST(CheckpointFile, AProducerThatThrowsKeepsTheOldCheckpoint) {
  TempDir d;
  write_checkpoint(d / "ckpt", small_checkpoint());
  Checkpoint bad = small_checkpoint();
  CheckpointSection p;
  p.name = "made";
  p.produce = [](const CheckpointSection::Sink& sink) {
    const std::vector<uint8_t> part(1000, 1);
    sink(part.data(), part.size());
    throw Error("out of luck");
  };
  bad.sections.push_back(p);
  EXPECT_THROW(write_checkpoint(d / "ckpt", bad), Error);
  expect_same(small_checkpoint(), read_checkpoint(d / "ckpt"));
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointFile, RoundTripsACheckpointWithNoSections) {
  TempDir d;
  Checkpoint c;
  c.node_id = "n";
  write_checkpoint(d / "ckpt", c);
  expect_same(c, read_checkpoint(d / "ckpt"));
}

TEST(CheckpointFile, LayoutStartsWithTheDocumentedHeader) {
  TempDir d;
  write_checkpoint(d / "ckpt", small_checkpoint());
  const std::vector<uint8_t> f = slurp(d / "ckpt");
  ASSERT_GT(f.size(), 50u);
  EXPECT_EQ(std::string(f.begin(), f.begin() + 4), "FWCK");
  EXPECT_EQ(f[4], 3);  // version 3, little-endian
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], 0);  // flags: not signed (no key given)
  EXPECT_EQ(f[7], 0);
  EXPECT_EQ(f[8], 0x08);  // round, little-endian
  EXPECT_EQ(f[15], 0x01);
  EXPECT_EQ(f[16], 0xa0);  // topology digest
  EXPECT_EQ(f[48], 15);    // node id length
  EXPECT_EQ(std::string(f.begin() + 50, f.begin() + 65), "site-a.worker_1");
}

TEST(CheckpointFile, ReplacingLeavesOnlyTheNewCheckpointAndNoTemporaryFiles) {
  TempDir d;
  Checkpoint old_c = small_checkpoint();
  old_c.sections.push_back({"extra", std::vector<uint8_t>(100000, 7)});
  write_checkpoint(d / "ckpt", old_c);
  Checkpoint new_c = small_checkpoint();
  new_c.round = 9;
  write_checkpoint(d / "ckpt", new_c);
  expect_same(new_c, read_checkpoint(d / "ckpt"));
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointFile, AFailedWriteKeepsTheOldCheckpoint) {
  TempDir d;
  write_checkpoint(d / "ckpt", small_checkpoint());
  Checkpoint bad = small_checkpoint();
  bad.sections[0].name = "Params";
  EXPECT_THROW(write_checkpoint(d / "ckpt", bad), ConfigError);
  const std::string msg = error_message<TransportError>(
      [&] { write_checkpoint(d / "no-dir" / "ckpt", small_checkpoint()); });
  EXPECT_TRUE(contains(msg, (d / "no-dir" / "ckpt").string())) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
  expect_same(small_checkpoint(), read_checkpoint(d / "ckpt"));
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointFile, EverySingleByteFlipIsDetected) {
  TempDir d;
  write_checkpoint(d / "good", small_checkpoint());
  const std::vector<uint8_t> good = slurp(d / "good");
  const fs::path bad = d / "bad";
  for (size_t off = 0; off < good.size(); ++off) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::vector<uint8_t> f = good;
      f[off] ^= mask;
      spit(bad, f, f.size());
      const std::string msg = error_message<CryptoError>([&] { read_checkpoint(bad); });
      ASSERT_TRUE(contains(msg, bad.string()))
          << "offset " << off << " mask " << int{mask} << ": '" << msg << "'";
    }
  }
}

TEST(CheckpointFile, CorruptSectionBytesNameTheSection) {
  TempDir d;
  write_checkpoint(d / "ckpt", small_checkpoint());
  std::vector<uint8_t> f = slurp(d / "ckpt");
  // The "params" bytes come right before "outer.opt-state"'s and the digest.
  f[f.size() - 32 - 3 - 1] ^= 0x10;
  spit(d / "ckpt", f, f.size());
  EXPECT_EQ(error_message<CryptoError>([&] { read_checkpoint(d / "ckpt"); }),
            "checkpoint " + (d / "ckpt").string() +
                ": section 'params' digest mismatch: the checkpoint is corrupt");
}

TEST(CheckpointFile, TruncationAtEveryOffsetIsDetected) {
  TempDir d;
  write_checkpoint(d / "good", small_checkpoint());
  const std::vector<uint8_t> good = slurp(d / "good");
  const fs::path bad = d / "bad";
  for (size_t n = 0; n < good.size(); ++n) {
    spit(bad, good, n);
    const std::string msg = error_message<CryptoError>([&] { read_checkpoint(bad); });
    ASSERT_TRUE(contains(msg, "truncated after " + std::to_string(n) + " bytes"))
        << "length " << n << ": '" << msg << "'";
  }
}

TEST(CheckpointFile, TrailingBytesAreRefused) {
  TempDir d;
  write_checkpoint(d / "ckpt", small_checkpoint());
  std::vector<uint8_t> f = slurp(d / "ckpt");
  f.push_back(0);
  spit(d / "ckpt", f, f.size());
  EXPECT_TRUE(contains(error_message<CryptoError>([&] { read_checkpoint(d / "ckpt"); }),
                       "1 trailing bytes after the manifest digest"));
}

TEST(CheckpointFile, HostileLengthsAreRefusedBeforeAllocating) {
  TempDir d;
  write_checkpoint(d / "good", small_checkpoint());
  const std::vector<uint8_t> good = slurp(d / "good");
  const size_t count_at = 50 + 15;
  const size_t first_length_at = count_at + 4 + 2 + 6;  // after "params"

  std::vector<uint8_t> f = good;
  for (size_t i = 0; i < 8; ++i) f[first_length_at + i] = 0xff;  // a 16 EiB section
  spit(d / "bad", f, f.size());
  std::string msg = error_message<CryptoError>([&] { read_checkpoint(d / "bad"); });
  EXPECT_TRUE(contains(msg, "section 'params' claims 18446744073709551615 bytes")) << msg;

  f = good;
  for (size_t i = 0; i < 4; ++i) f[count_at + i] = 0xff;
  spit(d / "bad", f, f.size());
  msg = error_message<CryptoError>([&] { read_checkpoint(d / "bad"); });
  EXPECT_TRUE(contains(msg, "section count 4294967295 over the limit 256")) << msg;

  f = good;
  f[48] = 0xff;
  f[49] = 0xff;
  spit(d / "bad", f, f.size());
  msg = error_message<CryptoError>([&] { read_checkpoint(d / "bad"); });
  EXPECT_TRUE(contains(msg, "node id length 65535 outside 1..64")) << msg;
}

TEST(CheckpointFile, AFutureVersionIsRefusedNamingBothVersions) {
  TempDir d;
  write_checkpoint(d / "ckpt", small_checkpoint());
  std::vector<uint8_t> f = slurp(d / "ckpt");
  f[4] = 4;
  spit(d / "ckpt", f, f.size());
  EXPECT_EQ(error_message<CryptoError>([&] { read_checkpoint(d / "ckpt"); }),
            "checkpoint " + (d / "ckpt").string() +
                ": format version 4 is newer than version 3, the newest this build reads: "
                "upgrade fedwan to load it");
}

TEST(CheckpointFile, AForeignFileIsRefused) {
  TempDir d;
  spit(d / "x", std::vector<uint8_t>(200, 'x'), 200);
  EXPECT_TRUE(contains(error_message<CryptoError>([&] { read_checkpoint(d / "x"); }), "bad magic"));
}

TEST(CheckpointFile, WriteRefusesBadNamesDuplicatesAndTooManySections) {
  TempDir d;
  auto refused = [&](const Checkpoint& c) {
    return error_message<ConfigError>([&] { write_checkpoint(d / "ckpt", c); });
  };
  for (const std::string& name :
       std::vector<std::string>{"", "Params", "a b", "a/b", std::string(65, 'a')}) {
    Checkpoint c = small_checkpoint();
    c.sections[0].name = name;
    EXPECT_TRUE(contains(refused(c), "section name '" + name + "' is invalid")) << name;
  }
  Checkpoint ok = small_checkpoint();
  ok.sections[0].name = std::string(64, 'z');
  EXPECT_EQ(refused(ok), "");

  Checkpoint dup = small_checkpoint();
  dup.sections[2].name = "params";
  EXPECT_EQ(refused(dup), "checkpoint section name 'params' appears twice: section names must "
                          "be unique");

  Checkpoint many;
  many.node_id = "n";
  for (int i = 0; i < 257; ++i) many.sections.push_back({"s" + std::to_string(i), {}});
  EXPECT_TRUE(contains(refused(many), "257 sections; at most 256")) << refused(many);
  many.sections.pop_back();
  EXPECT_EQ(refused(many), "");
  EXPECT_EQ(read_checkpoint(d / "ckpt").sections.size(), 256u);

  for (const std::string& id : std::vector<std::string>{"", "bad id", std::string(65, 'n')}) {
    Checkpoint c = small_checkpoint();
    c.node_id = id;
    EXPECT_TRUE(contains(refused(c), "node id '" + id + "' is invalid")) << id;
  }
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointFile, AMissingFileSaysSo) {
  TempDir d;
  const std::string msg = error_message<TransportError>([&] { read_checkpoint(d / "absent"); });
  EXPECT_EQ(msg,
            "cannot open checkpoint " + (d / "absent").string() + ": No such file or directory");
  EXPECT_TRUE(contains(error_message<TransportError>([&] { read_checkpoint(d.path()); }),
                       "not a regular file"));
}

}  // namespace
}  // namespace fedwan

// ---- signatures ----------------------------------------------------------------

#include "checkpoint/replica_store.hpp"
#include "harness/forge.hpp"
#include "harness/test_pki.hpp"

namespace fedwan {
namespace {

using fedwan::testing::TestPki;
using checkpoint::check_checkpoint_stream;
using checkpoint::CheckpointAssembly;

Checkpoint site_a_checkpoint(uint64_t round) {
  Checkpoint c;
  c.round = round;
  c.topology_digest = TestPki::get().topology().digest();
  c.node_id = "site-a";
  c.sections.push_back({"params", std::vector<uint8_t>(4000, 7)});
  c.sections.push_back({"meta", {'{', '}'}});
  return c;
}

CheckpointSignerCheck check_for(const std::string& node) {
  CheckpointSignerCheck c;
  c.verifier = TestPki::get().verifier();
  c.signer.node_id = node;
  c.signer.job = "unit-sign";
  return c;
}

TEST(SignedCheckpoint, RoundTripsAndNamesItsSigner) {
  TempDir d;
  const Checkpoint c = site_a_checkpoint(5);
  write_checkpoint(d / "ckpt", c, TestPki::get().key("site-a").get());
  const std::vector<uint8_t> f = slurp(d / "ckpt");
  EXPECT_EQ(f[6], kCheckpointFlagSigned);
  expect_same(c, read_checkpoint(d / "ckpt", check_for("site-a")));
  expect_same(c, read_checkpoint(d / "ckpt"));  // integrity only, without a verifier
  EXPECT_EQ(check_checkpoint_stream(d / "ckpt", "site-a", c.topology_digest, nullptr,
                                    check_for("site-a")),
            std::nullopt);
  // Only a node's own key signs its checkpoint.
  EXPECT_THROW(write_checkpoint(d / "x", c, TestPki::get().key("site-b").get()), ConfigError);
}

// The attack of the finding: the file edited and every digest recomputed.
// Integrity checks pass; the signature does not.
TEST(SignedCheckpoint, AnEditedAndRehashedFileIsRefused) {
  TempDir d;
  write_checkpoint(d / "ckpt", site_a_checkpoint(5), TestPki::get().key("site-a").get());
  Checkpoint forged = site_a_checkpoint(9);
  forged.sections[0].bytes.assign(4000, 42);
  fedwan::testing::forge_signed_checkpoint(d / "ckpt", forged);
  expect_same(forged, read_checkpoint(d / "ckpt"));  // intact as far as hashes go
  EXPECT_TRUE(contains(
      error_message<CryptoError>([&] { read_checkpoint(d / "ckpt", check_for("site-a")); }),
      "signature does not verify"));
  const auto why = check_checkpoint_stream(d / "ckpt", "site-a", forged.topology_digest, nullptr,
                                           check_for("site-a"));
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(contains(*why, "signature does not verify")) << *why;
}

TEST(SignedCheckpoint, UnsignedOrOtherSignersAreRefusedWhenASignatureIsExpected) {
  TempDir d;
  write_checkpoint(d / "plain", site_a_checkpoint(5));
  EXPECT_TRUE(contains(
      error_message<CryptoError>([&] { read_checkpoint(d / "plain", check_for("site-a")); }),
      "it is not signed"));
  const auto why = check_checkpoint_stream(
      d / "plain", "site-a", TestPki::get().topology().digest(), nullptr, check_for("site-a"));
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(contains(*why, "not signed")) << *why;
  // site-b's checkpoint read where site-a's is expected: the node id tells
  // (the caller reports a misplaced directory), never a signature pass.
  Checkpoint b = site_a_checkpoint(5);
  b.node_id = "site-b";
  write_checkpoint(d / "b", b, TestPki::get().key("site-b").get());
  EXPECT_EQ(read_checkpoint(d / "b", check_for("site-a")).node_id, "site-b");
  EXPECT_TRUE(
      check_checkpoint_stream(d / "b", "site-a", b.topology_digest, nullptr, check_for("site-a"))
          .has_value());
}

TEST(SignedCheckpoint, EverySingleByteChangeIsRefused) {
  TempDir d;
  write_checkpoint(d / "good", site_a_checkpoint(5), TestPki::get().key("site-a").get());
  const std::vector<uint8_t> good = slurp(d / "good");
  std::mt19937 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> bad = good;
    const size_t at = rng() % bad.size();
    bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    spit(d / "bad", bad, bad.size());
    EXPECT_FALSE(error_message<CryptoError>([&] {
                   read_checkpoint(d / "bad", check_for("site-a"));
                 }).empty() &&
                 error_message<TransportError>([&] {
                   read_checkpoint(d / "bad", check_for("site-a"));
                 }).empty())
        << "byte " << at;
    EXPECT_TRUE(check_checkpoint_stream(d / "bad", "site-a", TestPki::get().topology().digest(),
                                        nullptr, check_for("site-a"))
                    .has_value())
        << "byte " << at;
  }
}

TEST(SignedCheckpoint, AssemblyAndReplicaStoreKeepOnlySignedFiles) {
  TempDir d;
  write_checkpoint(d / "signed", site_a_checkpoint(3), TestPki::get().key("site-a").get());
  write_checkpoint(d / "plain", site_a_checkpoint(3));
  const auto send = [&](const fs::path& file, CheckpointAssembly& a, std::string* why) {
    const std::vector<uint8_t> bytes = slurp(file);
    const uint32_t piece = 1000;
    const uint32_t count = static_cast<uint32_t>((bytes.size() + piece - 1) / piece);
    CheckpointAssembly::Status st = CheckpointAssembly::Status::kMore;
    for (uint32_t i = 0; i < count && st == CheckpointAssembly::Status::kMore; ++i) {
      const size_t n = std::min<size_t>(piece, bytes.size() - size_t{i} * piece);
      st = a.add(i, count, 3, bytes.size(), bytes.data() + size_t{i} * piece, n, why);
    }
    return st;
  };
  for (const char* name : {"signed", "plain"}) {
    const std::vector<uint8_t> bytes = slurp(d / name);
    const uint32_t count = static_cast<uint32_t>((bytes.size() + 999) / 1000);
    CheckpointAssembly a(d / (std::string(name) + ".out"), "site-a",
                         TestPki::get().topology().digest(), 3, count, bytes.size(),
                         check_for("site-a"));
    std::string why;
    const auto st = send(d / name, a, &why);
    if (std::string(name) == "signed") {
      EXPECT_EQ(st, CheckpointAssembly::Status::kDone) << why;
    } else {
      EXPECT_EQ(st, CheckpointAssembly::Status::kFailed);
      EXPECT_TRUE(contains(why, "not signed")) << why;
      EXPECT_FALSE(fs::exists(d / "plain.out"));
    }
  }
  checkpoint::ReplicaStore store(d / "replicas", TestPki::get().topology().digest(), 2,
                                 TestPki::get().verifier(), "unit-sign");
  for (const char* name : {"plain", "signed"}) {
    const std::vector<uint8_t> bytes = slurp(d / name);
    const auto r = store.add_piece("site-a", 3, 0, 1, bytes.size(), bytes.data(), bytes.size());
    EXPECT_EQ(r.kind, std::string(name) == "signed"
                          ? checkpoint::ReplicaStore::Result::Kind::kStored
                          : checkpoint::ReplicaStore::Result::Kind::kRefused)
        << name << ": " << r.detail;
  }
  // A stored replica edited and re-hashed on the parent's disk is not served.
  const auto latest = store.latest("site-a");
  ASSERT_TRUE(latest.has_value());
  Checkpoint forged = site_a_checkpoint(3);
  forged.sections[0].bytes.assign(4000, 1);
  fedwan::testing::forge_signed_checkpoint(*latest, forged);
  EXPECT_FALSE(store.latest("site-a").has_value());
}

// Version 2 hashed the section bytes into the manifest digest too: such a
// file (a checkpoint from the release before) still reads and streams,
// and an edit of its bytes is still seen.
TEST(SignedCheckpoint, AVersion2FileStillReadsAndStreams) {
  TempDir d;
  write_checkpoint(d / "ckpt", site_a_checkpoint(5), TestPki::get().key("site-a").get());
  const Checkpoint c = site_a_checkpoint(5);
  fedwan::testing::forge_signed_checkpoint(d / "ckpt", c, 2);
  EXPECT_EQ(slurp(d / "ckpt")[4], 2);
  expect_same(c, read_checkpoint(d / "ckpt"));
  EXPECT_FALSE(check_checkpoint_stream(d / "ckpt", "site-a", c.topology_digest).has_value());
  std::vector<uint8_t> f = slurp(d / "ckpt");
  f[f.size() - 200] ^= 1;  // a byte of the last section
  spit(d / "ckpt", f, f.size());
  EXPECT_THROW(read_checkpoint(d / "ckpt"), CryptoError);
  EXPECT_TRUE(check_checkpoint_stream(d / "ckpt", "site-a", c.topology_digest).has_value());
}

}  // namespace
}  // namespace fedwan
