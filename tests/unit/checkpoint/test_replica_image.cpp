// Replica images (checkpoint/replica_image.hpp): an image carries what the
// parent cannot rebuild, comes back bit for bit (the residual to bf16), is
// far smaller than the checkpoint when the parameters sit on the anchor, and
// any damage or a wrong anchor is a CryptoError, never a wrong model.
#include "checkpoint/replica_image.hpp"
#include "harness/temp_dir.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/node_checkpoint.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan {
namespace {

using checkpoint::ReplicaPlan;

const ReplicaPlan kSitePlan{"anchor", {"params"}, {"residual"}};

struct SiteState {
  std::vector<float> params, anchor, residual;
  std::vector<uint8_t> blob;
};

SiteState site_state(size_t n, size_t moved) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  SiteState s;
  s.anchor.resize(n);
  for (float& v : s.anchor) v = g(rng);
  s.params = s.anchor;
  for (size_t i = 0; i < moved; ++i) s.params[(i * 7919) % n] += 1e-3f * g(rng);
  s.residual.resize(n);
  for (float& v : s.residual) v = 1e-7f * g(rng);
  s.blob.resize(5000);
  for (size_t i = 0; i < s.blob.size(); ++i) s.blob[i] = static_cast<uint8_t>(i % 13);
  return s;
}

Checkpoint checkpoint_of(const SiteState& s) {
  Checkpoint c;
  c.round = 12;
  c.topology_digest.fill(3);
  c.node_id = "site-a";
  c.sections.push_back(checkpoint::float_section("params", s.params.data(), s.params.size()));
  c.sections.push_back(checkpoint::float_section("anchor", s.anchor.data(), s.anchor.size()));
  c.sections.push_back(checkpoint::float_section("residual", s.residual.data(), s.residual.size()));
  const std::string meta = R"({"role":"site","data_position":77})";
  c.sections.push_back({"meta", std::vector<uint8_t>(meta.begin(), meta.end())});
  c.sections.push_back({"optimizer", s.blob});
  return c;
}

// The image in memory, as its file holds it.
Checkpoint image_of(const Checkpoint& c, const checkpoint::ReplicaPlan& plan) {
  Checkpoint image = checkpoint::make_replica_image(c, plan);
  materialize(image);
  return image;
}

size_t image_bytes(const Checkpoint& c) {
  size_t n = 0;
  for (const CheckpointSection& s : c.sections) n += s.size();
  return n;
}

std::vector<float> floats(const Checkpoint& c, const std::string& name) {
  return checkpoint::floats_of(c, name, 0);
}

TEST(ReplicaImage, ComesBackWholeWithTheAnchor) {
  const SiteState s = site_state(300000, 2000);
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  EXPECT_TRUE(checkpoint::is_replica_image(image));
  EXPECT_FALSE(checkpoint::is_replica_image(checkpoint_of(s)));
  EXPECT_EQ(image.find("anchor"), nullptr);  // the parent has it
  const Checkpoint back = checkpoint::expand_replica_image(image, s.anchor.data(), s.anchor.size());
  EXPECT_FALSE(checkpoint::is_replica_image(back));
  EXPECT_EQ(back.round, 12u);
  EXPECT_EQ(back.node_id, "site-a");
  const std::vector<float> params = floats(back, "params");
  ASSERT_EQ(params.size(), s.params.size());
  EXPECT_EQ(std::memcmp(params.data(), s.params.data(), params.size() * 4), 0);
  EXPECT_EQ(floats(back, "anchor"), s.anchor);
  EXPECT_EQ(back.find("optimizer")->bytes, s.blob);
  const auto meta = nlohmann::json::parse(back.find("meta")->bytes);
  EXPECT_EQ(meta["data_position"], 77);
  EXPECT_FALSE(meta.contains("replica"));
  // The residual to nearest bf16: within 2^-8 of each value.
  const std::vector<float> residual = floats(back, "residual");
  ASSERT_EQ(residual.size(), s.residual.size());
  for (size_t i = 0; i < residual.size(); ++i) {
    ASSERT_LE(std::fabs(residual[i] - s.residual[i]), std::ldexp(std::fabs(s.residual[i]), -8))
        << i;
  }
}

// One section decoded straight into the caller's buffer (a restore into
// place) is what the whole expansion holds; a wrong size, a missing section
// or the wrong anchor is refused before the buffer is touched.
TEST(ReplicaImage, OneSectionExpandsIntoTheCallersBuffer) {
  const SiteState s = site_state(300000, 2000);  // planes over several working blocks
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  const Checkpoint back = checkpoint::expand_replica_image(image, s.anchor.data(), s.anchor.size());
  for (const char* name : {"params", "residual", "optimizer"}) {
    SCOPED_TRACE(name);
    const CheckpointSection* whole = back.find(name);
    ASSERT_NE(whole, nullptr);
    ASSERT_EQ(checkpoint::replica_section_size(image, name), whole->size());
    std::vector<uint8_t> out(whole->size(), 0xEE);
    checkpoint::expand_replica_section(image, name, s.anchor.data(), s.anchor.size(), out.data(),
                                       out.size());
    EXPECT_EQ(out, whole->bytes);
  }
  EXPECT_FALSE(checkpoint::replica_section_size(image, "anchor").has_value());
  EXPECT_FALSE(checkpoint::replica_section_size(image, "nope").has_value());

  std::vector<uint8_t> out(s.params.size() * sizeof(float), 0xEE);
  const std::vector<uint8_t> untouched = out;
  const auto refused = [&](const char* name, const float* base, size_t bytes) {
    EXPECT_THROW(
        checkpoint::expand_replica_section(image, name, base, s.anchor.size(), out.data(), bytes),
        CryptoError)
        << name;
    EXPECT_EQ(out, untouched) << name;
  };
  refused("params", s.anchor.data(), out.size() - 4);
  refused("params", nullptr, out.size());
  std::vector<float> other = s.anchor;
  other[5] += 1.0f;
  refused("params", other.data(), out.size());
  refused("nope", s.anchor.data(), out.size());
  refused("anchor", s.anchor.data(), out.size());
}
TEST(ReplicaImage, IsAFractionOfTheCheckpoint) {
  const size_t n = 1000000;
  const SiteState s = site_state(n, 0);
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  // Parameters on the anchor: the image is about the bf16 residual, under
  // the 2 bytes per parameter of an fp16 update.
  EXPECT_LT(image_bytes(image), 2 * n);
  EXPECT_LT(image.find("params")->size(), n / 100);
  EXPECT_GT(image_bytes(checkpoint_of(s)), 12 * n);
}

TEST(ReplicaImage, WithoutTheAnchorGivesTheRestAndLeavesThePlanOut) {
  const SiteState s = site_state(4096, 100);
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  const Checkpoint part = checkpoint::expand_replica_image(image, nullptr, 0);
  EXPECT_EQ(part.find("params"), nullptr);
  EXPECT_EQ(part.find("anchor"), nullptr);
  EXPECT_EQ(part.find("optimizer")->bytes, s.blob);
  EXPECT_EQ(floats(part, "residual").size(), s.residual.size());
}

TEST(ReplicaImage, AnotherAnchorIsRefused) {
  const SiteState s = site_state(4096, 100);
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  std::vector<float> other = s.anchor;
  other[5] += 1.0f;
  EXPECT_THROW(checkpoint::expand_replica_image(image, other.data(), other.size()), CryptoError);
  EXPECT_EQ(checkpoint::replica_base_sha256(image),
            sha256(s.anchor.data(), s.anchor.size() * sizeof(float)));
}

TEST(ReplicaImage, DamagedSectionsAreRefused) {
  const SiteState s = site_state(4096, 100);
  for (const char* name : {"params", "residual", "optimizer"}) {
    for (const bool cut : {true, false}) {
      Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
      for (CheckpointSection& sec : image.sections) {
        if (sec.name != name) continue;
        if (cut) {
          sec.bytes.resize(sec.bytes.size() / 2);
        } else {
          sec.bytes[12] ^= 0x55;  // inside the zstd frame (the bf16 low plane is raw:
                                  // the file's section digest covers it)
        }
      }
      // Each frame carries its checksum: damage never decodes.
      EXPECT_THROW(checkpoint::expand_replica_image(image, s.anchor.data(), s.anchor.size()),
                   CryptoError)
          << name << (cut ? " cut" : " flipped");
    }
  }
}

TEST(ReplicaImage, BadMetaIsRefused) {
  const SiteState s = site_state(256, 10);
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  auto with_meta = [&](const std::string& m) {
    Checkpoint c = image;
    for (CheckpointSection& sec : c.sections) {
      if (sec.name == "meta") sec.bytes.assign(m.begin(), m.end());
    }
    return c;
  };
  const auto meta = nlohmann::json::parse(image.find("meta")->bytes);
  for (const std::string& m :
       {std::string(R"({"replica":{}})"),
        std::string(R"({"replica":{"base":"anchor","base_sha256":"zz","sections":[]}})"),
        [&] {
          auto j = meta;
          j["replica"]["sections"][0]["encoding"] = "lz4";
          return j.dump();
        }(),
        [&] {
          auto j = meta;
          j["replica"]["sections"][0]["bytes"] = 12;
          return j.dump();
        }(),
        [&] {
          auto j = meta;
          j["replica"]["sections"][0]["name"] = "missing";
          return j.dump();
        }()}) {
    EXPECT_THROW(checkpoint::expand_replica_image(with_meta(m), s.anchor.data(), s.anchor.size()),
                 CryptoError)
        << m;
  }
}

TEST(ReplicaImage, AnImageIsAnOrdinarySignedCheckpointFile) {
  testing::TempDir dir;
  const SiteState s = site_state(20000, 100);
  const Checkpoint image = image_of(checkpoint_of(s), kSitePlan);
  const auto path = dir.path() / "site-a.fwck";
  write_checkpoint(path, image);
  const Checkpoint read = read_checkpoint(path);
  EXPECT_TRUE(checkpoint::is_replica_image(read));
  const Checkpoint back = checkpoint::expand_replica_image(read, s.anchor.data(), s.anchor.size());
  EXPECT_EQ(floats(back, "params"), s.params);
}

// A node writes its checkpoint, then the image of the same state: the
// digests the checkpoint took are each section's SHA-256 (a produced one's
// too), and the image named by the anchor's digest from them is the image
// that hashes the anchor itself.
TEST(ReplicaImage, TheCheckpointsDigestOfTheAnchorNamesTheImagesBase) {
  testing::TempDir dir;
  const SiteState s = site_state(50000, 300);
  const Checkpoint c = checkpoint_of(s);
  const checkpoint::SectionDigests digests = checkpoint::save_node_checkpoint(dir.path(), c);
  ASSERT_EQ(digests.size(), c.sections.size());
  for (size_t i = 0; i < c.sections.size(); ++i) {
    EXPECT_EQ(digests[i], sha256(c.sections[i].data(), c.sections[i].size())) << i;
  }
  const Checkpoint image = checkpoint::make_replica_image(c, kSitePlan);
  const checkpoint::SectionDigests produced = write_checkpoint(dir.path() / "image.fwck", image);
  Checkpoint materialized = checkpoint::make_replica_image(c, kSitePlan);
  materialize(materialized);
  for (size_t i = 0; i < materialized.sections.size(); ++i) {
    const CheckpointSection& m = materialized.sections[i];
    EXPECT_EQ(produced[i], sha256(m.data(), m.size())) << m.name;
  }
  const std::array<uint8_t, 32>* anchor = checkpoint::section_digest(c, digests, "anchor");
  ASSERT_NE(anchor, nullptr);
  EXPECT_EQ(checkpoint::section_digest(c, digests, "nothing"), nullptr);
  checkpoint::save_replica_image(dir.path(), c, kSitePlan, {}, anchor);
  const Checkpoint named = read_checkpoint(checkpoint::replica_image_path(dir.path(), "site-a"));
  write_checkpoint(dir.path() / "hashed.fwck", checkpoint::make_replica_image(c, kSitePlan));
  const Checkpoint hashed = read_checkpoint(dir.path() / "hashed.fwck");
  ASSERT_EQ(named.sections.size(), hashed.sections.size());
  for (size_t i = 0; i < named.sections.size(); ++i) {
    EXPECT_EQ(named.sections[i].bytes, hashed.sections[i].bytes) << named.sections[i].name;
  }
  const Checkpoint back = checkpoint::expand_replica_image(named, s.anchor.data(), s.anchor.size());
  EXPECT_EQ(floats(back, "params"), s.params);
}

// Written straight from the checkpoint (each section compressed as the file
// is written), the file holds what the image in memory does.
TEST(ReplicaImage, StreamedToItsFileItHoldsTheImage) {
  testing::TempDir dir;
  const SiteState s = site_state(300000, 500);
  const Checkpoint c = checkpoint_of(s);
  write_checkpoint(dir.path() / "streamed.fwck", checkpoint::make_replica_image(c, kSitePlan));
  write_checkpoint(dir.path() / "whole.fwck", image_of(c, kSitePlan));
  const Checkpoint streamed = read_checkpoint(dir.path() / "streamed.fwck");
  const Checkpoint whole = read_checkpoint(dir.path() / "whole.fwck");
  ASSERT_EQ(streamed.sections.size(), whole.sections.size());
  for (size_t i = 0; i < whole.sections.size(); ++i) {
    EXPECT_EQ(streamed.sections[i].name, whole.sections[i].name);
    EXPECT_EQ(streamed.sections[i].bytes, whole.sections[i].bytes) << whole.sections[i].name;
  }
}

// A base large enough to be hashed on a helper thread while the image is
// written: the file is the one written with the base's digest given, and
// the image, written or materialized, names the base it was made against.
TEST(ReplicaImage, ABaseHashedWhileTheImageIsWrittenIsNamedAsOneGiven) {
  testing::TempDir dir;
  const SiteState s = site_state(size_t{3} << 20, 2000);  // a 12 MiB anchor
  const Checkpoint c = checkpoint_of(s);
  const Sha256Digest anchor = sha256(s.anchor.data(), s.anchor.size() * sizeof(float));
  write_checkpoint(dir.path() / "given.fwck",
                   checkpoint::make_replica_image(c, kSitePlan, &anchor));
  write_checkpoint(dir.path() / "aside.fwck", checkpoint::make_replica_image(c, kSitePlan));
  EXPECT_EQ(testing::slurp(dir.path() / "given.fwck"), testing::slurp(dir.path() / "aside.fwck"));
  EXPECT_EQ(checkpoint::replica_base_sha256(read_checkpoint(dir.path() / "aside.fwck")), anchor);
  const Checkpoint image = image_of(c, kSitePlan);
  EXPECT_EQ(checkpoint::replica_base_sha256(image), anchor);
  EXPECT_EQ(
      floats(checkpoint::expand_replica_image(image, s.anchor.data(), s.anchor.size()), "params"),
      s.params);
  // Made and dropped unwritten: its helper stops with it.
  { const Checkpoint unwritten = checkpoint::make_replica_image(c, kSitePlan); }
}

// A section already in bf16 (a residual kept so) comes back bit for bit,
// in the two planes an fp32 section kept to bf16 uses.
TEST(ReplicaImage, ABf16SectionComesBackBitForBit) {
  const SiteState s = site_state(70000, 10);
  std::vector<uint16_t> held(s.residual.size());
  for (size_t i = 0; i < held.size(); ++i) held[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  Checkpoint c = checkpoint_of(s);
  CheckpointSection r;
  r.name = "residual.bf16";
  r.view = reinterpret_cast<const uint8_t*>(held.data());
  r.view_size = held.size() * sizeof(uint16_t);
  c.sections.push_back(r);
  ReplicaPlan plan = kSitePlan;
  plan.bf16_held_sections = {"residual.bf16"};
  const Checkpoint image = image_of(c, plan);
  EXPECT_LT(image.find("residual.bf16")->size(), r.view_size);  // the high bytes compress
  const Checkpoint back = checkpoint::expand_replica_image(image, nullptr, 0);
  const CheckpointSection* got = back.find("residual.bf16");
  ASSERT_NE(got, nullptr);
  ASSERT_EQ(got->size(), r.view_size);
  EXPECT_EQ(std::memcmp(got->data(), held.data(), r.view_size), 0);
  plan.bf16_held_sections.clear();
  plan.bf16_sections = {"residual.bf16"};  // an odd number of bf16 values is not fp32
  held.pop_back();
  c.sections.back().view_size -= 2;
  EXPECT_THROW(image_of(c, plan), ConfigError);
}

TEST(ReplicaImage, AMissingBaseOrMismatchedSectionIsAConfigError) {
  SiteState s = site_state(64, 1);
  Checkpoint c = checkpoint_of(s);
  EXPECT_THROW(checkpoint::make_replica_image(c, {"nothing", {}, {}}), ConfigError);
  s.params.resize(63);
  c = checkpoint_of(s);
  EXPECT_THROW(checkpoint::make_replica_image(c, kSitePlan), ConfigError);
}

}  // namespace
}  // namespace fedwan
