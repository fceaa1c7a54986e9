// `fedwan certs init|issue|revoke|show`: provision a federation's identities,
// rotate or revoke one node's, and read a certificate (security/certs.hpp).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "common/atomic_file.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "security/certs.hpp"
#include "security/identity.hpp"

namespace fedwan::cli {
namespace {

namespace fs = std::filesystem;

struct CertsArgs {
  std::string topology;
  std::string out;
  std::string node;
  std::string file;
  int days = 365;
  int crl_days = 30;
  bool force = false;
  bool revoke_previous = false;
};

constexpr const char* kCaKeyNote =
    "Keep the CA key secret and offline: whoever holds it can mint identities for this "
    "federation. `fedwan certs issue` and `fedwan certs revoke` need it; nodes never do.";

// A certificate is at most a few KiB: a larger file is not one, and is not
// read whole.
std::string read_text(const fs::path& path) {
  ReadFileOptions o;
  o.what = "certificate";
  o.max_bytes = size_t{1} << 20;
  o.too_large_hint = "it is not a certificate";
  return read_file(path, o);
}

std::chrono::seconds crl_validity(int days) { return std::chrono::hours(24) * days; }

// A certificate is untrusted input and this goes to a terminal: control
// characters (escape sequences) are shown as '?'.
std::string printable(std::string s) {
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return s;
}

security::CertificateSummary summary_of(const fs::path& cert) {
  return security::summary_from_pem(read_text(cert));
}

// "site in eu", "region eu", "root".
std::string describe(const security::NodeIdentity& id) {
  std::string s = security::role_ou(id.role);
  if (id.region.empty()) return s;
  return s + (id.role == Role::kSite ? " in " : " ") + printable(id.region);
}

security::IssueOptions issue_options(const CertsArgs& a) {
  security::IssueOptions o;
  o.validity = std::chrono::hours(24) * a.days;
  o.crl_validity = crl_validity(a.crl_days);
  return o;
}

int run_init(const CertsArgs& a) {
  const Topology topo = Topology::load(a.topology);
  security::provision_federation(topo, a.out, issue_options(a), a.force);
  const fs::path out(a.out);
  size_t id_width = 0, role_width = 0, dir_width = 0;
  for (const NodeSpec& n : topo.nodes()) {
    id_width = std::max(id_width, n.id.size());
    role_width = std::max(role_width, describe(security::identity_for(topo, n.id)).size());
    dir_width = std::max(dir_width, (out / n.id).string().size() + 1);
  }
  std::cout << "provisioned federation '" << topo.job() << "' in " << out.string() << ": "
            << topo.nodes().size() << " node bundles, certificates valid " << a.days
            << " days, CRL valid " << a.crl_days << " days (refresh it before then: `fedwan "
            << "certs crl refresh`)\n";
  for (const NodeSpec& n : topo.nodes()) {
    const security::CertificateSummary s = summary_of(out / n.id / "cert.pem");
    std::cout << "  " << std::left << std::setw(static_cast<int>(id_width)) << n.id << "  "
              << std::setw(static_cast<int>(role_width)) << describe(s.identity) << "  "
              << std::setw(static_cast<int>(dir_width)) << (out / n.id).string() + "/"
              << "  serial " << s.serial_hex << "\n";
  }
  std::cout << "CA certificate: " << (out / "ca" / "ca.pem").string()
            << " (every bundle holds a copy)\n"
            << "CA key:         " << (out / "ca" / "ca.key").string() << "\n  " << kCaKeyNote
            << "\nGive each node only its own bundle directory (ca.pem, cert.pem, key.pem, "
               "crl.pem) as its credentials directory.\n";
  return 0;
}

int run_issue(const CertsArgs& a) {
  const Topology topo = Topology::load(a.topology);
  const security::NodeIdentity id = security::identity_for(topo, a.node);
  const fs::path out(a.out);
  const fs::path cert = out / a.node / "cert.pem";
  if (a.revoke_previous && fs::exists(cert)) {
    const std::string old_serial = summary_of(cert).serial_hex;
    security::revoke_node(a.out, a.node, crl_validity(a.crl_days));
    std::cout << "revoked the previous certificate of " << a.node << ", serial " << old_serial
              << "; every bundle's crl.pem was updated\n";
  }
  security::issue_node(a.out, id, issue_options(a));
  const security::CertificateSummary s = summary_of(cert);
  std::cout << "issued a new key and certificate for " << a.node << " (" << describe(id)
            << "): serial " << s.serial_hex << ", valid " << s.not_before << " to " << s.not_after
            << "\nbundle: " << (out / a.node).string() << "/ - give it to the node";
  if (!a.revoke_previous) {
    std::cout << ". The previous certificate stays valid until it expires; if its key may be "
                 "compromised, run `fedwan certs issue --revoke-previous` instead";
  }
  std::cout << "\n";
  return 0;
}

int run_admin(const CertsArgs& a) {
  const fs::path out(a.out);
  const fs::path cert = out / security::kAdminName / "cert.pem";
  if (a.revoke_previous && fs::exists(cert)) {
    security::revoke_node(a.out, security::kAdminName, crl_validity(a.crl_days));
    std::cout << "revoked the previous admin certificate; every bundle's crl.pem was updated\n";
  }
  security::issue_admin(a.out, issue_options(a));
  const security::CertificateSummary s = summary_of(cert);
  std::cout << "issued the admin key and certificate: serial " << s.serial_hex << ", valid "
            << s.not_before << " to " << s.not_after
            << "\nbundle: " << (out / security::kAdminName).string()
            << "/ - it signs topology versions (`fedwan topology sign`); keep it with the "
               "operators, never on a node\n";
  return 0;
}

int run_revoke(const CertsArgs& a) {
  security::revoke_node(a.out, a.node, crl_validity(a.crl_days));
  const fs::path out(a.out);
  const security::CertificateSummary s = summary_of(out / a.node / "cert.pem");
  std::cout << "revoked certificate serial " << s.serial_hex << " of node " << a.node << " ("
            << describe(s.identity) << ")\n"
            << "updated " << (out / "ca" / "crl.pem").string()
            << " and the crl.pem of every bundle under " << out.string()
            << "; nodes re-read the CRL at their next handshake and refuse " << a.node
            << " from then on. Copy the new crl.pem to nodes whose bundles live elsewhere.\n"
            << "To let " << a.node << " rejoin, issue it a new certificate with `fedwan certs "
            << "issue`.\n";
  return 0;
}

int run_crl_refresh(const CertsArgs& a) {
  security::refresh_crl(a.out, crl_validity(a.crl_days));
  const security::CrlSummary c = security::crl_summary(a.out);
  std::cout << "signed a new CRL (number " << c.number << ", " << c.revoked_serials.size()
            << " revoked certificates), valid until " << c.next_update << "\n"
            << "updated " << (fs::path(a.out) / "ca" / "crl.pem").string()
            << " and the crl.pem of every bundle under " << a.out
            << "; copy it to nodes whose bundles live elsewhere. Running nodes pick it up "
               "at their next handshake, without a restart.\n";
  return 0;
}

int run_crl_show(const CertsArgs& a) {
  const security::CrlSummary c = security::crl_summary(a.out);
  std::cout << "number     " << c.number << "\n"
            << "lastUpdate " << c.last_update << "\n"
            << "nextUpdate " << c.next_update << "\n"
            << "revoked    " << c.revoked_serials.size() << "\n";
  for (const std::string& serial : c.revoked_serials) std::cout << "  " << serial << "\n";
  return 0;
}

int run_show(const CertsArgs& a) {
  fs::path file(a.file);
  if (fs::is_directory(file)) file /= "cert.pem";  // a bundle directory
  const security::CertificateSummary s = summary_of(file);
  const security::NodeIdentity& id = s.identity;
  std::cout << "node       " << printable(id.node_id) << "\n"
            << "role       " << (id.admin ? security::kAdminOu : security::role_ou(id.role)) << "\n"
            << "region     " << (id.region.empty() ? "-" : printable(id.region)) << "\n"
            << "job        " << printable(id.job) << "\n"
            << "serial     " << s.serial_hex << "\n"
            << "notBefore  " << s.not_before << "\n"
            << "notAfter   " << s.not_after << "\n";
  return 0;
}

// The flags several subcommands share, bound to the arguments their
// callbacks own.
void add_topology_flag(CLI::App* cmd, CertsArgs& a) {
  cmd->add_option("--topology", a.topology, "topology YAML file")
      ->required()
      ->check(CLI::ExistingFile);
}

void add_out_flag(CLI::App* cmd, CertsArgs& a) {
  cmd->add_option("--out", a.out, "federation directory (ca/ and one bundle per node)")->required();
}

void add_days_flag(CLI::App* cmd, CertsArgs& a) {
  cmd->add_option("--days", a.days, "node certificate validity in days")
      ->check(CLI::Range(1, 3650))
      ->capture_default_str();
}

void add_crl_days_flag(CLI::App* cmd, CertsArgs& a) {
  cmd->add_option("--crl-days", a.crl_days,
                  "validity of the CRL signed now, in days; nodes warn a week before it runs "
                  "out (`fedwan certs crl refresh` signs a new one)")
      ->check(CLI::Range(1, 3650))
      ->capture_default_str();
}

using SharedArgs = std::shared_ptr<CertsArgs>;

void add_init(CLI::App* certs, const SharedArgs& args, int* exit_code) {
  CLI::App* init = certs->add_subcommand(
      "init", "create a federation CA and a key, certificate and CRL bundle for every node");
  add_topology_flag(init, *args);
  add_out_flag(init, *args);
  add_days_flag(init, *args);
  add_crl_days_flag(init, *args);
  init->add_flag("--force", args->force,
                 "replace an existing CA and its bundles (their certificates stop verifying)");
  init->footer(kCaKeyNote);
  init->callback([args, exit_code] { *exit_code = run_init(*args); });
}

void add_issue(CLI::App* certs, const SharedArgs& args, int* exit_code) {
  CLI::App* issue = certs->add_subcommand(
      "issue", "give one node a new key and certificate (rotation) from the CA in --out");
  add_topology_flag(issue, *args);
  add_out_flag(issue, *args);
  issue->add_option("--node", args->node, "the node's id in the topology")->required();
  add_days_flag(issue, *args);
  add_crl_days_flag(issue, *args);
  issue->add_flag("--revoke-previous", args->revoke_previous,
                  "revoke the node's current certificate first (its key may be compromised)");
  issue->callback([args, exit_code] { *exit_code = run_issue(*args); });
}

void add_admin(CLI::App* certs, const SharedArgs& args, int* exit_code) {
  CLI::App* admin = certs->add_subcommand(
      "admin", "issue (or re-issue) the admin identity that signs topology versions, <out>/admin");
  add_out_flag(admin, *args);
  add_days_flag(admin, *args);
  add_crl_days_flag(admin, *args);
  admin->add_flag("--revoke-previous", args->revoke_previous,
                  "revoke the current admin certificate first (its key may be compromised)");
  admin->callback([args, exit_code] { *exit_code = run_admin(*args); });
}

void add_revoke(CLI::App* certs, const SharedArgs& args, int* exit_code) {
  CLI::App* revoke = certs->add_subcommand(
      "revoke", "revoke a node's current certificate and update every bundle's crl.pem");
  add_out_flag(revoke, *args);
  revoke->add_option("--node", args->node, "the node whose certificate to revoke")->required();
  add_crl_days_flag(revoke, *args);
  revoke->callback([args, exit_code] { *exit_code = run_revoke(*args); });
}

void add_crl(CLI::App* certs, const SharedArgs& args, int* exit_code) {
  CLI::App* crl = certs->add_subcommand("crl", "refresh or show the federation's CRL");
  crl->require_subcommand(1);
  CLI::App* refresh = crl->add_subcommand(
      "refresh", "sign the CRL again (same revocations, new validity) and update every bundle");
  add_out_flag(refresh, *args);
  add_crl_days_flag(refresh, *args);
  refresh->callback([args, exit_code] { *exit_code = run_crl_refresh(*args); });
  CLI::App* crl_show =
      crl->add_subcommand("show", "print the CRL's dates, number and revoked serials");
  add_out_flag(crl_show, *args);
  crl_show->callback([args, exit_code] { *exit_code = run_crl_show(*args); });
}

void add_show(CLI::App* certs, const SharedArgs& args, int* exit_code) {
  CLI::App* show =
      certs->add_subcommand("show", "print a node certificate's identity, serial and validity");
  show->add_option("file", args->file, "a cert.pem, or a bundle directory")
      ->required()
      ->check(CLI::ExistingPath);
  show->callback([args, exit_code] { *exit_code = run_show(*args); });
}

}  // namespace

void add_certs_command(CLI::App& app, int* exit_code) {
  CLI::App* certs =
      app.add_subcommand("certs", "provision, rotate and revoke the federation's identities");
  certs->require_subcommand(1);
  // The subcommands' callbacks own the arguments they fill in.
  auto args = std::make_shared<CertsArgs>();
  add_init(certs, args, exit_code);
  add_issue(certs, args, exit_code);
  add_admin(certs, args, exit_code);
  add_revoke(certs, args, exit_code);
  add_crl(certs, args, exit_code);
  add_show(certs, args, exit_code);
}

}  // namespace fedwan::cli
