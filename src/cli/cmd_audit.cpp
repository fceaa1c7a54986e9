// `fedwan audit verify FILE` and `fedwan audit show FILE`: check and read a
// node's hash-chained audit log (security/audit_log.hpp).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "common/terminal_text.hpp"
#include "fedwan/error.hpp"
#include "security/audit_log.hpp"
#include "security/node_key.hpp"

namespace fedwan::cli {
namespace {

using nlohmann::json;

struct AuditArgs {
  std::string file;
  std::vector<std::string> events;  // show: only these events (all when empty)
  std::string expect_head;          // verify: a hash recorded earlier
  std::string ca;                   // verify: check signed heads against this CA
  std::string crl;                  // verify: ... and this CRL
};

constexpr const char* kAnchorNote =
    "A node with credentials signs the head of its log when it opens and closes it and every "
    "minute in between; --ca checks those signatures, so a log rewritten and re-hashed, or "
    "forged, does not verify. Removing entries from the end is caught by --expect-head with a "
    "hash recorded earlier (the printed last hash, kept somewhere else), and a log that does "
    "not end in its node's closing head is reported.\n";

// A log is untrusted input and this goes to a terminal: shown through
// terminal_text, which escapes what could drive the terminal.
std::string printable(const std::string& s) {
  return terminal_text(s, security::kAuditMaxLineBytes);
}

int run_verify(const AuditArgs& a) {
  std::unique_ptr<security::SignatureVerifier> ca;
  if (!a.ca.empty()) ca = std::make_unique<security::SignatureVerifier>(a.ca, a.crl);
  security::AuditVerifyOptions o;
  o.ca = ca.get();
  o.expect_head = a.expect_head;
  const security::AuditVerifyResult r = security::verify_audit_file(a.file, o);
  if (!r.ok) {
    std::cerr << a.file;
    if (r.first_bad_line > 0) std::cerr << ":" << r.first_bad_line;
    std::cerr << ": " << printable(r.problem) << "\n";
    return 1;
  }
  if (r.entries == 0) {
    std::cerr << a.file
              << ": the log is empty: no entry to verify (a node that ran with this "
                 "log writes at least its security mode)\n";
    return 1;
  }
  std::cout << "ok: " << r.entries << " entries, chain intact; last hash " << r.last_hash << "\n";
  if (r.signed_heads == 0) {
    std::cout << "unsigned: no signed head (the node ran without credentials); the chain proves "
                 "no authorship, and a rewritten log would verify too\n";
  } else {
    std::cout << "signed heads: " << r.signed_heads << " by '" << printable(r.signer) << "'"
              << (ca ? ", every one verified against " + a.ca
                     : std::string(" (give --ca ca.pem to check them)"))
              << "; the last at entry " << *r.last_signed_seq << "\n";
    if (!r.closed) {
      std::cout << "open: the log does not end with its node's closing head: the node is "
                   "running or crashed, or entries after "
                << *r.last_signed_seq << " were removed (--expect-head settles it)\n";
    }
  }
  if (!a.expect_head.empty())
    std::cout << "recorded head " << a.expect_head << " is in the chain\n";
  return 0;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

struct ShownEntry {
  std::string event;
  std::string text;  // "seq  time  node  event  key=value ..."
};

// Nothing when `line` is not an entry the reader can show (verify says what
// is wrong with it).
std::optional<ShownEntry> describe(const std::string& line) {
  if (line.size() > security::kAuditMaxLineBytes ||
      security::audit_line_too_deep(line.data(), line.data() + line.size())) {
    return std::nullopt;
  }
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto seq = j.find("seq");
  const auto time = j.find("time");
  const auto node = j.find("node");
  const auto event = j.find("event");
  const auto fields = j.find("fields");
  if (seq == j.end() || !seq->is_number_unsigned() || time == j.end() || !time->is_string() ||
      node == j.end() || !node->is_string() || event == j.end() || !event->is_string() ||
      fields == j.end() || !fields->is_object()) {
    return std::nullopt;
  }
  ShownEntry e;
  e.event = event->get<std::string>();
  e.text = std::to_string(seq->get<uint64_t>()) + "  " + time->get_ref<const std::string&>() +
           "  " + node->get_ref<const std::string&>() + "  " + e.event;
  for (const auto& item : fields->items()) e.text += "  " + item.key() + "=" + dump(item.value());
  e.text = printable(e.text);
  return e;
}

int run_show(const AuditArgs& a) {
  // Verifying first also turns an unreadable file into a ConfigError.
  const security::AuditVerifyResult r = security::verify_audit_file(a.file);
  std::ifstream in(a.file, std::ios::binary);
  if (!in) throw ConfigError("cannot read audit log " + a.file);
  // Line by line, never holding more than one line of the limit: a file
  // without newlines is not read whole.
  std::string line;
  uint64_t line_no = 0;
  bool too_long = false;
  const auto show = [&] {
    ++line_no;
    const std::optional<ShownEntry> e = too_long ? std::nullopt : describe(line);
    if (!e) {
      std::cout << "line " << line_no << ": (not a readable entry)\n";
    } else if (a.events.empty() ||
               std::find(a.events.begin(), a.events.end(), e->event) != a.events.end()) {
      std::cout << e->text << "\n";
    }
    line.clear();
    too_long = false;
  };
  char block[1 << 16];
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    const std::streamsize got = in.gcount();
    for (std::streamsize i = 0; i < got; ++i) {
      if (block[i] == '\n') {
        show();
      } else if (!too_long) {
        line += block[i];
        if (line.size() > security::kAuditMaxLineBytes) {
          too_long = true;
          line.clear();
        }
      }
    }
  }
  if (!line.empty() || too_long) show();
  if (in.bad()) throw ConfigError("cannot read audit log " + a.file);
  if (!r.ok) {
    std::cerr << "warning: " << a.file << ":" << r.first_bad_line << ": " << printable(r.problem)
              << "; entries from that line on cannot be trusted\n";
    return 1;
  }
  return 0;
}

}  // namespace

void add_audit_command(CLI::App& app, int* exit_code) {
  CLI::App* audit = app.add_subcommand("audit", "check and read a node's tamper-evident audit log");
  audit->require_subcommand(1);
  // The subcommands' callbacks own the arguments they fill in.
  auto args = std::make_shared<AuditArgs>();

  CLI::App* verify = audit->add_subcommand(
      "verify", "check the hash chain and the signed heads; print the entry count and the last "
                "hash");
  verify->add_option("file", args->file, "audit log (JSONL)")->required();
  verify
      ->add_option("--expect-head", args->expect_head,
                   "a hash recorded earlier (a printed last hash): the chain must still hold "
                   "it, or entries were removed or rewritten")
      ->check([](const std::string& h) {
        const bool hex = h.size() == 64 && h.find_first_not_of("0123456789abcdef") == h.npos;
        return hex ? std::string() : std::string("must be 64 lower-case hex digits");
      });
  add_ca_flags(*verify, args->ca, args->crl,
               "the federation's ca.pem: check every signed head against it (and require at "
               "least one)",
               "with --ca: a crl.pem; heads by revoked keys fail");
  verify->footer(kAnchorNote);
  verify->callback([args, exit_code] { *exit_code = run_verify(*args); });

  CLI::App* show =
      audit->add_subcommand("show", "print one line per entry: seq, time, node, event, fields");
  show->add_option("file", args->file, "audit log (JSONL)")->required();
  show->add_option("--event", args->events, "show only this event (repeatable)");
  show->footer(
      "Exits 1, after printing, with a warning on stderr when the chain does not verify.\n");
  show->callback([args, exit_code] { *exit_code = run_show(*args); });
}

}  // namespace fedwan::cli
