#include "cli/demo_versions.hpp"

#include <optional>
#include <system_error>
#include <vector>

#include "common/atomic_file.hpp"
#include "security/certs.hpp"
#include "security/node_key.hpp"
#include "security/topology_signature.hpp"

namespace fedwan::cli {

namespace fs = std::filesystem;

AddedSite prepare_added_site(const Topology& v1, const fs::path& dir, const fs::path& pki,
                             const std::string& metrics) {
  std::vector<NodeSpec> nodes = v1.nodes();
  size_t sites = 0;
  double weight = 0;
  std::optional<uint64_t> devices;  // as many as the others (its ranks)
  for (const NodeSpec& n : nodes) {
    if (n.role != Role::kSite) continue;
    sites += 1;
    weight += n.weight;
    devices = n.devices;
  }
  NodeSpec added;
  added.id = "site-" + std::to_string(sites);
  added.role = Role::kSite;
  added.parent = v1.find("region-0") != nullptr ? "region-0" : v1.root().id;
  added.weight = sites > 0 ? weight / static_cast<double>(sites) : 1.0;
  added.metrics = metrics;
  added.devices = devices;
  nodes.push_back(added);
  const Topology next =
      Topology::build(v1.job(), v1.federation(), nodes, v1.policy()).as_successor_of(v1);
  std::error_code ec;
  if (!fs::exists(pki / security::kAdminName / "cert.pem", ec)) security::issue_admin(pki.string());
  const auto admin = security::NodeKey::from_bundle((pki / security::kAdminName).string());
  const Topology signed_version = security::sign_topology(next, *admin);
  security::issue_node(pki.string(), security::identity_for(signed_version, added.id));
  AddedSite out{signed_version.node(added.id), (dir / "topology-v2.yaml").string()};
  write_file_atomic(out.topology, signed_version.to_yaml(), 0644);
  return out;
}

}  // namespace fedwan::cli
