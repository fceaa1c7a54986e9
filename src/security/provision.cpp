// The public face of provisioning (fedwan/security.hpp) over security::certs.
#include <chrono>
#include <filesystem>

#include "fedwan/error.hpp"
#include "fedwan/security.hpp"
#include "security/certs.hpp"

namespace fedwan {

void provision_credentials(const Topology& topology, const std::string& dir, int validity_days,
                           bool overwrite) {
  if (validity_days < 1) {
    throw ConfigError("validity_days must be >= 1, got " + std::to_string(validity_days));
  }
  security::IssueOptions o;
  o.validity = std::chrono::hours(24) * validity_days;
  security::provision_federation(topology, dir, o, overwrite);
}

SecurityOptions credentials_in(const std::string& dir, const std::string& node_id) {
  SecurityOptions s;
  s.credentials_dir = (std::filesystem::path(dir) / node_id).string();
  return s;
}

}  // namespace fedwan
