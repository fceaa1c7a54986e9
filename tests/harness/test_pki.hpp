// A small provisioned federation for unit tests that sign and verify: a CA
// and bundles for root, eu (a region), site-a and site-b of job "unit-sign",
// made once per test process in a private directory.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "fedwan/topology.hpp"
#include "harness/temp_dir.hpp"
#include "security/certs.hpp"
#include "security/node_key.hpp"

namespace fedwan::testing {

class TestPki {
 public:
  static const TestPki& get() {
    static const TestPki pki;
    return pki;
  }
  const Topology& topology() const { return topo_; }
  std::filesystem::path dir() const { return dir_.path() / "pki"; }
  std::string bundle(const std::string& node) const { return (dir() / node).string(); }
  std::shared_ptr<const security::NodeKey> key(const std::string& node) const {
    return security::NodeKey::from_bundle(bundle(node));
  }
  std::shared_ptr<const security::SignatureVerifier> verifier() const {
    return security::SignatureVerifier::from_bundle(bundle("root"));
  }

 private:
  TestPki()
      : topo_(Topology::parse(R"(job: unit-sign
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/unit-sign-root"}
  - {id: eu, role: region, parent: root, endpoint: "ipc:///tmp/unit-sign-eu"}
  - {id: site-a, role: site, parent: eu}
  - {id: site-b, role: site, parent: eu}
)")) {
    security::provision_federation(topo_, dir().string());
  }
  TempDir dir_;
  Topology topo_;
};

}  // namespace fedwan::testing
