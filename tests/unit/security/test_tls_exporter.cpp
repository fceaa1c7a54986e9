// The keys a link uses come from the TLS exporter with the frame cipher as
// its context: the cipher, named in a header nobody authenticated yet, is
// bound to the handshake. Two ends that disagree on it derive unrelated keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <random>

#include "fedwan/topology.hpp"
#include "security/certs.hpp"
#include "security/tls_session.hpp"

namespace fedwan::security {
namespace {

namespace fs = std::filesystem;

const char* kYaml = R"(job: unit-exporter
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/unit-exporter-root"}
  - {id: a, role: site, parent: root}
)";

class TlsExporter : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    topo_ = new Topology(Topology::parse(kYaml));
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("fedwan-unit-exporter-" + std::to_string(std::random_device{}())));
    provision_federation(*topo_, dir_->string());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete topo_;
  }

  // A completed handshake between site a (client) and the root (server).
  struct Pair {
    std::unique_ptr<TlsHandshake> child, parent;
  };
  static Pair handshake() {
    Pair p;
    p.child =
        std::make_unique<TlsHandshake>(std::make_shared<TlsContext>((*dir_ / "a").string()), true);
    p.parent = std::make_unique<TlsHandshake>(
        std::make_shared<TlsContext>((*dir_ / "root").string()), false);
    std::vector<uint8_t> to_parent, to_child;
    p.child->step(nullptr, 0, &to_parent);
    for (int i = 0; i < 10 && (!to_parent.empty() || !to_child.empty()); ++i) {
      std::vector<uint8_t> next_child, next_parent;
      if (!to_parent.empty()) p.parent->step(to_parent.data(), to_parent.size(), &next_child);
      if (!to_child.empty()) p.child->step(to_child.data(), to_child.size(), &next_parent);
      to_parent = std::move(next_parent);
      to_child = std::move(next_child);
    }
    return p;
  }

  static Topology* topo_;
  static fs::path* dir_;
};

Topology* TlsExporter::topo_ = nullptr;
fs::path* TlsExporter::dir_ = nullptr;

TEST_F(TlsExporter, BothEndsDeriveTheSameKeysForTheSameCipher) {
  for (const AeadAlgorithm c : {AeadAlgorithm::kAes256Gcm, AeadAlgorithm::kChaCha20Poly1305}) {
    Pair p = handshake();
    ASSERT_EQ(p.child->state(), TlsHandshake::State::kDone) << p.child->error();
    ASSERT_EQ(p.parent->state(), TlsHandshake::State::kDone) << p.parent->error();
    const LinkKeys k1 = p.child->export_keys(c);
    const LinkKeys k2 = p.parent->export_keys(c);
    EXPECT_EQ(k1.child_to_parent_key, k2.child_to_parent_key);
    EXPECT_EQ(k1.parent_to_child_key, k2.parent_to_child_key);
    EXPECT_EQ(k1.child_to_parent_iv, k2.child_to_parent_iv);
    EXPECT_EQ(k1.parent_to_child_iv, k2.parent_to_child_iv);
    EXPECT_NE(k1.child_to_parent_key, k1.parent_to_child_key);
  }
}

TEST_F(TlsExporter, EndsThatDisagreeOnTheCipherShareNoKey) {
  Pair p = handshake();
  ASSERT_EQ(p.child->state(), TlsHandshake::State::kDone) << p.child->error();
  ASSERT_EQ(p.parent->state(), TlsHandshake::State::kDone) << p.parent->error();
  const LinkKeys child = p.child->export_keys(AeadAlgorithm::kAes256Gcm);
  const LinkKeys parent = p.parent->export_keys(AeadAlgorithm::kChaCha20Poly1305);
  EXPECT_NE(child.child_to_parent_key, parent.child_to_parent_key);
  EXPECT_NE(child.parent_to_child_key, parent.parent_to_child_key);
  EXPECT_NE(child.child_to_parent_iv, parent.child_to_parent_iv);
  EXPECT_NE(child.parent_to_child_iv, parent.parent_to_child_iv);
}

}  // namespace
}  // namespace fedwan::security
