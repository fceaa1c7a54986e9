// `fedwan demo --add-site ROUND`: the operator's side of a topology version
// (docs/operations.md, "Topology versions"), played by the demo: version 2
// of the demo's topology with one more site, signed with the demo PKI's
// admin bundle, and the new site's credentials from the same CA.
#pragma once

#include <filesystem>
#include <string>

#include "fedwan/topology.hpp"

namespace fedwan::cli {

struct AddedSite {
  NodeSpec node;         // as version 2 lists it
  std::string topology;  // version 2's file (signed), beside the demo's topology
};

// Appends "site-<number of sites>" under region-0 (the root when there are
// no regions) with the sites' mean weight and `metrics` as its metrics
// address, signs the result as version 2 with <pki>/admin (issued first when
// an earlier run's PKI lacks it), issues the site's bundle into <pki>, and
// writes the version to <dir>/topology-v2.yaml. Throws ConfigError (no
// admin bundle can be made, a plaintext demo) or CryptoError.
AddedSite prepare_added_site(const Topology& v1, const std::filesystem::path& dir,
                             const std::filesystem::path& pki, const std::string& metrics);

}  // namespace fedwan::cli
