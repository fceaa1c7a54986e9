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
#include "fedwan/error.hpp"
#include "security/audit_log.hpp"

namespace fedwan::cli {
namespace {

using nlohmann::json;

struct AuditArgs {
  std::string file;
  std::vector<std::string> events;  // show: only these events (all when empty)
};

constexpr const char* kAnchorNote =
    "Removing entries from the end of a log cannot be detected from the file alone: record "
    "the printed last hash somewhere else (a ticket, another host) and compare it later.\n";

int run_verify(const AuditArgs& a) {
  const security::AuditVerifyResult r = security::verify_audit_file(a.file);
  if (!r.ok) {
    std::cerr << a.file << ":" << r.first_bad_line << ": " << r.problem << "\n";
    return 1;
  }
  std::cout << "ok: " << r.entries << " entries, chain intact; last hash " << r.last_hash << "\n";
  return 0;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A log is untrusted input and this goes to a terminal: control characters
// (escape sequences) are shown as '?'. dump() already escapes them in strings.
std::string printable(std::string s) {
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return s;
}

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
  e.text = printable(std::move(e.text));
  return e;
}

int run_show(const AuditArgs& a) {
  // Verifying first also turns an unreadable file into a ConfigError.
  const security::AuditVerifyResult r = security::verify_audit_file(a.file);
  std::ifstream in(a.file, std::ios::binary);
  if (!in) throw ConfigError("cannot read audit log " + a.file);
  std::string line;
  uint64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::optional<ShownEntry> e = describe(line);
    if (!e) {
      std::cout << "line " << line_no << ": (not a readable entry)\n";
    } else if (a.events.empty() ||
               std::find(a.events.begin(), a.events.end(), e->event) != a.events.end()) {
      std::cout << e->text << "\n";
    }
  }
  if (in.bad()) throw ConfigError("cannot read audit log " + a.file);
  if (!r.ok) {
    std::cerr << "warning: " << a.file << ":" << r.first_bad_line << ": " << r.problem
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
      "verify", "check the hash chain; print the entry count and the last hash");
  verify->add_option("file", args->file, "audit log (JSONL)")->required();
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
