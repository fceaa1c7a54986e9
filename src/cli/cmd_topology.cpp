// `fedwan topology`: topology versions (docs/operations.md, "Topology
// versions").
//   sign    makes the version after a running topology from an edited copy:
//           numbers it, lists the earlier digests, checks that it only adds
//           or removes sites, and signs it with the admin bundle.
//   verify  prints a topology's version, digest and history, and checks its
//           signature against the federation CA (exit 1 when it fails).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "common/atomic_file.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "security/node_key.hpp"
#include "security/topology_signature.hpp"
#include "topology/topology_version.hpp"

namespace fedwan::cli {
namespace {

namespace fs = std::filesystem;

struct TopologyArgs {
  std::string previous;
  std::string topology;
  std::string admin;
  std::string out;
  std::string bundle;
};

std::string ids(const Topology& t, const std::vector<uint32_t>& indices) {
  std::string s;
  for (uint32_t i : indices) {
    const NodeSpec& n = t.node(i);
    s += (s.empty() ? "" : ", ") + n.id + (n.removed ? "" : " (under " + n.parent + ")");
  }
  return s;
}

int run_sign(const TopologyArgs& a) {
  const Topology previous = Topology::load(a.previous);
  const Topology next = Topology::load(a.topology).as_successor_of(previous);
  const topology::VersionChange change = topology::version_change(previous, next);
  const auto key = security::NodeKey::from_bundle(a.admin);
  const Topology signed_version = security::sign_topology(next, *key);
  write_file_atomic(a.out, signed_version.to_yaml(), 0644);
  std::cout << "topology version " << signed_version.version() << " (digest "
            << signed_version.digest_hex().substr(0, 12) << ") signed by the admin, written to "
            << a.out << "\n";
  if (!change.added.empty()) std::cout << "  adds    " << ids(next, change.added) << "\n";
  if (!change.removed.empty()) std::cout << "  removes " << ids(next, change.removed) << "\n";
  std::cout << "Put it in place of every aggregator's topology file (they adopt it within a "
               "heartbeat: audit entry topology_adopted); then issue the new sites' "
               "credentials (`fedwan certs issue --topology "
            << a.out << " --node ID`) and start them with this file.\n";
  return 0;
}

int run_verify(const TopologyArgs& a) {
  const Topology t = Topology::load(a.topology);
  std::cout << "job      " << t.job() << "\n"
            << "version  " << t.version() << "\n"
            << "digest   " << t.digest_hex() << "\n";
  for (size_t i = 0; i < t.history().size(); ++i) {
    const auto& d = t.history()[i];
    std::cout << "history  version " << (i + 1) << ": " << to_hex(d.data(), d.size()) << "\n";
  }
  if (!t.signature()) {
    std::cout << "signature none" << (t.version() > 1 ? " (aggregators will not adopt it)" : "")
              << "\n";
    return t.version() > 1 ? 1 : 0;
  }
  const fs::path bundle(a.bundle);
  security::SignatureVerifier verifier(
      (bundle / "ca.pem").string(),
      fs::exists(bundle / "crl.pem") ? (bundle / "crl.pem").string() : std::string());
  if (auto why = security::topology_signature_problem(t, verifier)) {
    std::cout << "signature INVALID: " << *why << "\n";
    return 1;
  }
  std::cout << "signature valid (the federation's admin)\n";
  return 0;
}

}  // namespace

void add_topology_command(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("topology", "sign and check topology versions");
  cmd->require_subcommand(1);
  auto args = std::make_shared<TopologyArgs>();

  CLI::App* sign = cmd->add_subcommand(
      "sign", "make and sign the version after a running topology (sites added or removed)");
  sign->add_option("--previous", args->previous, "the topology the federation runs now")
      ->required()
      ->check(CLI::ExistingFile);
  sign->add_option("--topology", args->topology,
                   "the edited copy: new sites appended at the end, removed sites marked "
                   "`removed: true`")
      ->required()
      ->check(CLI::ExistingFile);
  sign->add_option("--admin", args->admin, "the admin bundle directory (<pki>/admin)")
      ->required()
      ->check(CLI::ExistingDirectory);
  sign->add_option("--out", args->out, "where to write the signed version")->required();
  sign->callback([args, exit_code] { *exit_code = run_sign(*args); });

  CLI::App* verify =
      cmd->add_subcommand("verify", "print a topology's version and history; check its signature");
  verify->add_option("--topology", args->topology, "topology YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  verify
      ->add_option("--bundle", args->bundle,
                   "any bundle of the federation (its ca.pem and crl.pem), e.g. <pki>/admin")
      ->required()
      ->check(CLI::ExistingDirectory);
  verify->callback([args, exit_code] { *exit_code = run_verify(*args); });
}

}  // namespace fedwan::cli
