#include "costs/cost_checks.hpp"

#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace fedwan::costs {
namespace {

int role_rank(const std::string& role) {
  if (role == "root") return 2;
  if (role == "region") return 1;
  return 0;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

// Who is whose parent, and what role each node has.
class Tree {
 public:
  Tree(const CostLedger& ledger, const Topology* topo) : topo_(topo) {
    for (const auto& entry : ledger.records()) roles_[entry.first.first] = entry.second.role;
    if (topo_) {
      for (const NodeSpec& n : topo_->nodes()) {
        roles_[n.id] = role_name(n.role);
        if (n.devices) devices_[n.id] = *n.devices;
        if (n.role != Role::kRoot) parents_[n.id] = n.parent;
      }
      return;
    }
    // A node's parent is its one peer of a higher role.
    std::map<std::string, std::set<std::string>> higher;
    for (const auto& entry : ledger.records()) {
      const CostRecord& r = entry.second;
      for (const auto& link : r.links) {
        const auto peer = roles_.find(link.first);
        if (peer != roles_.end() && role_rank(peer->second) > role_rank(r.role)) {
          higher[r.node].insert(link.first);
        }
      }
    }
    for (const auto& [node, peers] : higher) {
      if (peers.size() == 1) parents_[node] = *peers.begin();
    }
  }
  const std::string* parent(const std::string& node) const {
    const auto it = parents_.find(node);
    return it == parents_.end() ? nullptr : &it->second;
  }
  const std::string* role(const std::string& node) const {
    const auto it = roles_.find(node);
    return it == roles_.end() ? nullptr : &it->second;
  }
  std::optional<uint64_t> devices(const std::string& node) const {
    const auto it = devices_.find(node);
    if (it == devices_.end()) return std::nullopt;
    return it->second;
  }

 private:
  const Topology* topo_;
  std::map<std::string, std::string> roles_, parents_;
  std::map<std::string, uint64_t> devices_;
};

using ByRound = std::map<uint64_t, const CostRecord*>;

// Why `r`'s device time is past its bound, or nullopt. Counts what it checked.
std::optional<std::string> device_time_refusal(const CostRecord& r, const Tree& tree,
                                               const std::map<std::string, ByRound>& by_node,
                                               const CostTolerance& tol, CheckedCosts* out) {
  if (r.device_us == 0) return std::nullopt;
  if (r.role != "site") {
    return "a " + r.role + " trains on no device, but the record claims " +
           seconds_text(r.train_seconds) + " on " + std::to_string(r.devices);
  }
  const std::optional<uint64_t> allowed = tree.devices(r.node);
  if (allowed && r.devices > *allowed) {
    return "claims " + std::to_string(r.devices) + " devices; the topology allows " +
           cost_printable(r.node) + " " + std::to_string(*allowed);
  }
  double wall = r.end_time.minus(r.start_time);
  std::string whose = "its own record";
  bool from_parent = false;
  if (const std::string* parent = tree.parent(r.node)) {
    const auto p = by_node.find(*parent);
    const auto it = p == by_node.end() ? ByRound::const_iterator{} : p->second.find(r.round);
    if (p != by_node.end() && it != p->second.end()) {
      // From the end of the parent's previous round to the end of this one
      // (a parent that restarted mid-round started its record late).
      const CostRecord& pr = *it->second;
      const UtcTime from =
          it == p->second.begin() ? pr.start_time : std::prev(it)->second->end_time;
      wall = std::min(wall, pr.end_time.minus(from));
      whose = cost_printable(*parent) + "'s record";
      from_parent = true;
    }
  }
  const double bound = std::max(0.0, wall) * (1 + tol.time_relative) + tol.time_seconds;
  if (r.train_seconds <= bound) {
    out->devices_from_topology += allowed.has_value();
    out->wall_from_parent += from_parent;
    return std::nullopt;
  }
  return "claims " + seconds_text(r.train_seconds) + " of training on " +
         std::to_string(r.devices) + " device(s) in round " + std::to_string(r.round) +
         ", which lasted " + seconds_text(wall) + " (" + whose + "; at most " +
         seconds_text(bound) + " with the tolerance)";
}

bool differs(uint64_t a, uint64_t b, const CostTolerance& tol) {
  const uint64_t diff = a > b ? a - b : b - a;
  const double allowed =
      std::max(static_cast<double>(tol.link_bytes), tol.link_relative * static_cast<double>(b));
  return static_cast<double>(diff) > allowed;
}

// By (child, parent).
using Links = std::map<std::pair<std::string, std::string>, LinkReconciliation>;

LinkReconciliation& link_of(Links& links, const std::string& child, const std::string& parent) {
  LinkReconciliation& l = links[{child, parent}];
  l.child = child;
  l.parent = parent;
  return l;
}

std::map<std::string, ByRound> records_by_node(const CostLedger& ledger) {
  std::map<std::string, ByRound> all;
  for (const auto& entry : ledger.records())
    all[entry.first.first][entry.first.second] = &entry.second;
  return all;
}

// The records within their bounds, by node and round; the rest go to
// `out->refused`. The records point into `ledger`.
std::map<std::string, ByRound> within_bounds(const CostLedger& ledger, const Topology* topology,
                                             const Tree& tree, const CostTolerance& tol,
                                             CheckedCosts* out) {
  const std::map<std::string, ByRound> all = records_by_node(ledger);  // for the walls
  std::map<std::string, ByRound> kept;
  for (const auto& entry : ledger.records()) {
    const CostRecord& r = entry.second;
    if (topology && topology->find(r.node) == nullptr) {
      out->refused.push_back({r.origin, r.node, r.round,
                              "not a node of the topology (job " + cost_printable(topology->job()) +
                                  ", version " + std::to_string(topology->version()) +
                                  "); if a later version added it, bill with that one"});
      continue;
    }
    if (std::optional<std::string> why = device_time_refusal(r, tree, all, tol, out)) {
      out->refused.push_back({r.origin, r.node, r.round, *why});
      continue;
    }
    kept[r.node][r.round] = &r;
  }
  return kept;
}

// Bills each kept record, its bytes to its parent at the parent's count
// where the parent recorded the round too.
void bill_kept_records(const std::map<std::string, ByRound>& kept, const Tree& tree, Links* links,
                       CheckedCosts* out) {
  for (const auto& [node, rounds] : kept) {
    const std::string* parent = tree.parent(node);
    const auto p = parent ? kept.find(*parent) : kept.end();
    for (const auto& [round, rec] : rounds) {
      CostRecord billed = *rec;
      if (parent && billed.links.count(*parent)) {
        LinkReconciliation& l = link_of(*links, node, *parent);
        const CostRecord* pr = nullptr;
        if (p != kept.end()) {
          const auto it = p->second.find(round);
          if (it != p->second.end() && it->second->links.count(node)) pr = it->second;
        }
        LinkBytes& mine = billed.links[*parent];
        if (pr) {
          const LinkBytes& theirs = pr->links.at(node);
          l.child_sent += mine.sent;
          l.child_received += mine.received;
          l.parent_received += theirs.received;
          l.parent_sent += theirs.sent;
          ++l.rounds_both;
          mine = {theirs.received, theirs.sent};
        } else {
          ++l.rounds_child_only;
        }
      }
      if (billed.device_us > 0) ++out->device_records;
      out->billed.push_back(std::move(billed));
    }
  }
}

// A round the parent counted and the child has no billable record of.
void bill_unrecorded_child_rounds(const std::map<std::string, ByRound>& kept, const Tree& tree,
                                  Links* links, CheckedCosts* out) {
  for (const auto& [parent, rounds] : kept) {
    for (const auto& [round, pr] : rounds) {
      for (const auto& [child, bytes] : pr->links) {
        const std::string* its_parent = tree.parent(child);
        const std::string* role = tree.role(child);
        if (!its_parent || *its_parent != parent || !role) continue;
        const auto c = kept.find(child);
        if (c != kept.end() && c->second.count(round)) continue;
        CostRecord r;
        r.job = pr->job;
        r.node = child;
        r.role = *role;
        r.round = round;
        r.start = pr->start;
        r.end = pr->end;
        r.start_time = pr->start_time;
        r.end_time = pr->end_time;
        r.links[parent] = {bytes.received, bytes.sent};
        r.origin = pr->origin + " (" + parent + "'s count)";
        ++link_of(*links, child, parent).rounds_parent_only;
        out->billed.push_back(std::move(r));
      }
    }
  }
}

}  // namespace

CheckedCosts check_costs(const CostLedger& ledger, const Topology* topology,
                         const CostTolerance& tol) {
  CheckedCosts out;
  const Tree tree(ledger, topology);
  // 1. Device time within its bounds; what is past them is not billed.
  const std::map<std::string, ByRound> kept = within_bounds(ledger, topology, tree, tol, &out);
  // 2. Bytes on a child's link to its parent at the parent's count.
  Links links;
  bill_kept_records(kept, tree, &links, &out);
  bill_unrecorded_child_rounds(kept, tree, &links, &out);
  for (auto& entry : links) {
    LinkReconciliation& l = entry.second;
    l.mismatch = differs(l.child_sent, l.parent_received, tol) ||
                 differs(l.child_received, l.parent_sent, tol);
    out.links.push_back(l);
  }
  return out;
}

}  // namespace fedwan::costs
