// Aggregator, topology versions (docs/operations.md, "Topology versions"):
// an operator changes a running federation by writing a later version of
// its topology, signed by the federation's admin identity, where the
// aggregators read it. Every heartbeat an aggregator looks at its topology
// file; when it changed, the new version is checked (a successor of the
// running one: only sites added or removed, topology/topology_version.hpp;
// signed by the admin: security/topology_signature.hpp) and adopted, or
// refused with an audit entry and an alarm. Adopting takes effect at once,
// and what it changes counts like membership does: an added site is a
// newcomer (welcomed at the round boundary after it comes, counted from
// there), a removed site leaves (not waited for; refused from then on).
// Its chunks already in the open round stay counted, exactly once.
#include <algorithm>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "common/atomic_file.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"
#include "security/topology_signature.hpp"
#include "topology/topology_version.hpp"

namespace fedwan {

std::optional<std::string> Aggregator::Impl::file_changed() {
  // By content: a version copied in with the running file's size and time
  // (`cp -p`, `rsync -t`) is a change all the same. The file is a few KiB.
  std::string text;
  try {
    ReadFileOptions limit;
    limit.what = "topology file";
    limit.max_bytes = kMaxWatchedTopologyBytes;
    text = read_file(opt_.topology_file, limit);
  } catch (const ConfigError&) {
    return std::nullopt;  // being replaced, gone, or no topology: looked at again next time
  }
  const Sha256Digest digest = sha256(text.data(), text.size());
  if (digest == watch_.content) return std::nullopt;
  watch_.content = digest;
  return text;
}

void Aggregator::Impl::check_topology_file() {
  if (opt_.topology_file.empty()) return;
  const std::optional<std::string> text = file_changed();
  if (!text) return;
  std::optional<Topology> next;
  std::string why;
  try {
    next = Topology::parse(*text, opt_.topology_file);
    if (next->digest() == topo_.digest() || topo_.knows_digest(next->digest())) {
      return;  // the running version, or one it ran before (the file went back)
    }
    (void)topology::version_change(topo_, *next);
    security_->refresh_crl();  // an admin revoked a moment ago signs nothing more
    if (!security_->verifier()) {
      throw ConfigError("this node runs in plaintext: without the federation CA it cannot check "
                        "the admin's signature, so it adopts no topology version");
    }
    if (auto bad = security::topology_signature_problem(*next, *security_->verifier())) {
      throw ConfigError(*bad);
    }
  } catch (const Error& e) {
    why = e.what();
  }
  if (!why.empty()) {
    // Once per change of the file: it is not looked at again until it changes.
    nlohmann::json fields = {
        {"file", opt_.topology_file}, {"running_version", topo_.version()}, {"reason", why}};
    if (next) fields["version"] = next->version(), fields["digest"] = next->digest_hex();
    security_->audit("topology_refused", fields);
    security_->alarm("topology_refused", "the topology in " + opt_.topology_file +
                                             " was not adopted (still running version " +
                                             std::to_string(topo_.version()) + "): " + why);
    return;
  }
  adopt_topology(std::move(*next));
}

void Aggregator::Impl::adopt_topology(Topology next) {
  const topology::VersionChange change = topology::version_change(topo_, next);
  const uint64_t from = topo_.version();
  opt_.topology = std::move(next);  // topo_ refers to it
  self_.children = topo_.node(self_.index).children;
  nlohmann::json added = nlohmann::json::array(), removed = nlohmann::json::array();
  for (uint32_t idx : change.added) {
    const NodeSpec& n = topo_.node(idx);
    added.push_back(n.id);
    if (n.parent_index != self_.index) continue;
    // Like a late_join site: not waited for until it comes; a newcomer then.
    add_child(idx, /*late=*/true);
    if (acc_) acc_->add_child(idx);
    clip_children_copies(idx);
  }
  for (uint32_t idx : change.removed) {
    removed.push_back(topo_.node(idx).id);
    const std::optional<size_t> slot = down_.link.find(topo_.node(idx).id);
    if (slot) remove_child(down_.children[*slot]);
  }
  // A region's weight cap follows its sites: up at once; down at a round
  // boundary once the region itself has dropped them (open_round).
  for (Child& c : down_.children) {
    if (!c.is_site) c.weight = std::max(c.weight, topo_.weight_under(c.index));
  }
  summary_.topology_version = topo_.version();
  security_->audit("topology_adopted", {{"version", topo_.version()},
                                        {"from_version", from},
                                        {"digest", topo_.digest_hex()},
                                        {"round", round_},
                                        {"added", added},
                                        {"removed", removed}});
  log().info("[agg:{}] adopted topology version {} (from {}; {} site(s) added, {} removed)",
             self_.id, topo_.version(), from, added.size(), removed.size());
  membership_changed();
  update_metrics();
}

void Aggregator::Impl::remove_child(Child& c) {
  if (c.removed) return;
  const bool was_member = c.member;
  c.removed = true;
  c.member = false;
  c.live = false;
  c.rejoin_pending = false;
  c.away = Away::kLeft;
  c.weight = 0;
  clear_outbox(c);
  // Told over its session while it has one: from now on its link refuses
  // it, and a refusal in plain text is not believed while a session is up.
  refuse(c.id,
         "'" + c.id + "' was removed from the federation (topology version " +
             std::to_string(topo_.version()) + ")",
         /*count=*/false);
  // Not waited for; what it delivered to the open round stays counted.
  if (acc_ && acc_->is_open()) acc_->set_expected(c.index, false);
  summary_.membership_changes += 1;
  security_->audit("member_removed", {{"peer", c.id},
                                      {"round", round_},
                                      {"version", topo_.version()},
                                      {"was_member", was_member}});
  log().info("[agg:{}] '{}' removed by topology version {} at round {}", self_.id, c.id,
             topo_.version(), round_);
}

}  // namespace fedwan
