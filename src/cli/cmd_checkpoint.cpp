// `fedwan checkpoint digest FILE...`: checks that each checkpoint file is
// intact (its sections against its manifest, its manifest against its
// trailer; with --ca, its signature by its own node) and prints its node,
// round and digest: the digest a parent's
// `replica_stored` audit entry gives for the replica it kept, and a child's
// `replica_restored` for the one it installed.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "checkpoint/replica_store.hpp"
#include "cli/commands.hpp"
#include "common/sha256.hpp"
#include "common/terminal_text.hpp"
#include "security/node_key.hpp"

namespace fedwan::cli {
namespace {

struct CheckpointArgs {
  std::vector<std::string> files;
  std::string ca;   // check each file's signature against this CA
  std::string crl;  // ... and this CRL
};

int run_digest(const CheckpointArgs& a) {
  std::shared_ptr<const security::SignatureVerifier> ca;
  if (!a.ca.empty()) ca = std::make_shared<security::SignatureVerifier>(a.ca, a.crl);
  int code = 0;
  for (const std::string& file : a.files) {
    checkpoint::CheckpointIdentity id;
    std::optional<std::string> bad = checkpoint::check_checkpoint_integrity(file, &id);
    std::string signature = id.is_signed ? "signed" : "unsigned";
    if (!bad && ca) {
      // The file's own node must have signed it, with a certificate of this CA.
      CheckpointSignerCheck check;
      check.verifier = ca;
      check.signer.node_id = id.node_id;
      bad = id.is_signed ? checkpoint::check_checkpoint_stream(file, id.node_id, id.topology_digest,
                                                               nullptr, check)
                         : std::optional<std::string>("checkpoint " + file +
                                                      ": it is not signed (--ca asks for a "
                                                      "signature)");
      signature = "signed by its node, verified against " + a.ca;
    }
    if (bad) {
      std::cerr << "error: " << terminal_text(*bad, 4096) << "\n";
      code = 1;
      continue;
    }
    // The node id comes from the file: printed through terminal_text.
    std::cout << to_hex(id.digest.data(), id.digest.size()) << "  " << terminal_text(file, 4096)
              << "  node " << terminal_text(id.node_id, 256) << ", round " << id.round
              << ", topology " << to_hex(id.topology_digest.data(), 8) << ", "
              << terminal_text(signature, 4096) << "\n";
  }
  return code;
}

}  // namespace

void add_checkpoint_command(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "check and name a node's checkpoint files");
  cmd->require_subcommand(1);
  auto args = std::make_shared<CheckpointArgs>();
  CLI::App* digest = cmd->add_subcommand(
      "digest", "check each file is an intact checkpoint and print its digest (as the audit log's "
                "replica_stored and replica_restored entries give it), node, round and topology");
  digest->add_option("files", args->files, "checkpoint files (.fwck)")->required();
  add_ca_flags(*digest, args->ca, args->crl,
               "the federation's ca.pem: each file must be signed by its own node with a "
               "certificate of this CA",
               "with --ca: a crl.pem; files signed by revoked keys fail");
  digest->footer(
      "The digest is the SHA-256 of the checkpoint's header and manifest, which names every "
      "section's SHA-256; its signature covers it. It is not the SHA-256 of the whole file. "
      "The signature is checked only with --ca. Exits 1 when a file is not an intact checkpoint "
      "(or, with --ca, not signed by its node under that CA).\n");
  digest->callback([args, exit_code] { *exit_code = run_digest(*args); });
}

}  // namespace fedwan::cli
