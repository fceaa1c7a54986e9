// Aggregator, elastic membership (docs/operations.md, "Membership"): which
// children count. A child is a member once welcomed; it stops being one
// when it leaves or pauses outside its participation window (announced on
// a heartbeat, wire::kFlagLeaving / kFlagPausing), and a late_join site
// becomes one when it first comes. The quorum is a share of the members'
// weight (a region's members: what its heartbeats report, never more than
// its sites' topology weight), so it follows the live membership; a member
// that crashed stays one (the round waits for it as before). Newcomers and
// children coming back from a leave or a pause count from the next round
// boundary: they are welcomed there, with that round's model.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "aggregator/role.hpp"
#include "common/log.hpp"
#include "fedwan/error.hpp"
#include "topology/participation_window.hpp"

namespace fedwan {

const char* Aggregator::Impl::away_name(Away a) { return aggregator::ChildTable::away_name(a); }

double Aggregator::Impl::member_weight() const { return down_.children.member_weight(); }

uint32_t Aggregator::Impl::member_sites() const { return down_.children.member_sites(); }

void Aggregator::Impl::refresh_quorum() {
  // A hair under, so a sum of the same weights in another order still counts.
  if (acc_ && acc_->is_open()) acc_->set_min_weight(cfg_.quorum * member_weight() * (1 - 1e-9));
}

void Aggregator::Impl::membership_changed() {
  refresh_quorum();
  role_->report_membership();  // a region's, to its parent
  close_ready_chunks();
  pace_children();  // a child no longer owing holds nobody back
}

void Aggregator::Impl::on_membership(Child& c, const wire::ParsedFrame& f) {
  const uint8_t flags = f.header.flags;
  if (flags & wire::kFlagMembership) {
    wire::MembershipPayload p;
    if (c.is_site || !wire::decode_membership(f.payload, f.payload_size, &p)) {
      refuse(c.id,
             c.is_site ? "a site has no membership to report" : "malformed membership report");
      return;
    }
    // A region speaks for its own sites only: never more than their weight.
    const double w = std::min(p.weight, c.weight);
    const uint32_t sites =
        std::min<uint32_t>(p.sites, static_cast<uint32_t>(topo_.sites_under(c.index).size()));
    if (w == c.member_weight && sites == c.member_sites) return;
    c.member_weight = w;
    c.member_sites = sites;
    // None left: it sits the round out (check_round_wait), not waited for;
    // what it delivered stays counted.
    if (w <= 0 && acc_ && acc_->is_open()) acc_->set_expected(c.index, false);
    // A region may change its report as often as it likes: rate limited.
    security_->audit_noise(
        "membership", "membership:" + c.id,
        {{"peer", c.id}, {"round", round_}, {"member_weight", w}, {"member_sites", sites}},
        "[agg:" + self_.id + "] '" + c.id + "' reports " + std::to_string(sites) +
            " member sites, weight " + std::to_string(w));
    membership_changed();
    return;
  }
  const bool leaving = (flags & wire::kFlagLeaving) != 0;
  if (!c.is_site || (flags & wire::kFlagLeaving && flags & wire::kFlagPausing)) {
    refuse(c.id, c.is_site ? "a heartbeat cannot both leave and pause"
                           : "a region cannot leave or pause; its sites do");
    return;
  }
  if (c.away == Away::kLeft || c.away == Away::kPaused) return;  // said already
  if (!leaving) {
    if (std::optional<std::string> why = pause_refusal(c)) {
      // It stays a member and is waited for: a site that then falls silent
      // is lost, not excused.
      security_->audit_noise("pause_refused", "pause_refused:" + c.id,
                             {{"peer", c.id}, {"round", round_}, {"reason", *why}},
                             "[agg:" + self_.id + "] refused the pause of '" + c.id + "': " + *why);
      refuse(c.id, "pause refused: " + *why, false);
      return;
    }
  }
  const bool was_member = c.member;
  c.away = leaving ? Away::kLeft : Away::kPaused;
  c.member = false;
  c.live = false;
  c.rejoin_pending = false;
  clear_outbox(c);
  const char* event = leaving ? "member_left" : "member_paused";
  security_->audit(event, {{"peer", c.id}, {"round", round_}, {"was_member", was_member}});
  log().info("[agg:{}] '{}' {} at round {}; not waited for from now on", self_.id, c.id,
             leaving ? "left" : "paused (outside its participation window)", round_);
  summary_.membership_changes += 1;
  if (acc_ && acc_->is_open()) acc_->set_expected(c.index, false);
  membership_changed();
}

std::optional<std::string> Aggregator::Impl::pause_refusal(const Child& c) const {
  // The windows its topology entry declares, at the wall clock's now
  // (aggregator/child_table.hpp says when a pause is taken).
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const topology::ParticipationWindows windows(topo_.node(c.index).windows);
  return aggregator::ChildTable::pause_refusal(c, windows, now);
}

bool Aggregator::Impl::admit_newcomer(Child& c) {
  if (c.member) return false;
  // A hello again while it waits for the boundary changes nothing (and is
  // not audited again).
  if (c.rejoin_pending) return true;
  // Not a member (never joined, left, or paused): it counts from the next
  // round boundary, where it is welcomed with that round's model.
  security_->audit("member_joining", {{"peer", c.id},
                                      {"round", round_},
                                      {"from", away_name(c.away)},
                                      {"counts_from_round", round_ + 1}});
  log().info("[agg:{}] '{}' joins ({}); it counts from round {}", self_.id, c.id, away_name(c.away),
             round_ + 1);
  c.rejoin_pending = true;
  if (acc_ && acc_->is_open()) acc_->set_expected(c.index, false);
  return true;
}

void Aggregator::Impl::became_member(Child& c) {
  if (c.member) return;
  c.member = true;
  const Away from = c.away;
  c.away = Away::kNo;
  summary_.membership_changes += 1;
  security_->audit("member_joined", {{"peer", c.id}, {"round", round_}, {"from", away_name(from)}});
  // A larger membership never makes a chunk ready: no close_ready_chunks
  // here (welcome_one runs inside round steps).
  refresh_quorum();
  // Reported once the event loop comes round: children welcomed together
  // (a region's first welcome) go up in one report.
  membership_.report_due = true;
}

aggregator::RoundWait Aggregator::Impl::round_wait() const {
  if (!acc_ || !acc_->is_open() || phase_ != Phase::kTraining) return {};
  // Members the round does not expect now but that can still deliver to it:
  // lost ones rejoin and are welcomed mid-round, deferred ones at once
  // after (release_held_back).
  std::vector<aggregator::AbsentMember> absent;
  for (const Child& c : down_.children) {
    if (!c.member || c.removed || acc_->expected(c.index)) continue;
    absent.push_back(
        {c.index, c.id, c.is_site ? c.weight : c.member_weight, c.live ? "rejoining" : "lost"});
  }
  return aggregator::judge_round_wait(*acc_, absent, cfg_.quorum,
                                      [this](uint32_t idx) { return topo_.node(idx).id; });
}

void Aggregator::Impl::check_round_wait() {
  const aggregator::RoundWait w = round_wait();
  if (w.state == aggregator::RoundWait::State::kNever && role_->sits_out_empty_rounds() &&
      member_weight() <= 0) {
    // Every site under this region left or paused: there is nothing to
    // aggregate, and its parent counts it with weight 0 (its membership
    // reports say so). It sits the round out, sending nothing up, and
    // relays the next anchor as it comes; a site back counts from a
    // boundary as anywhere.
    log().info("[agg:{}] round {}: no member left under it; sitting the round out", self_.id,
               round_);
    security_->audit("round_sat_out", {{"round", round_}, {"reason", "no member"}});
    complete_round();
    return;
  }
  if (w.state == aggregator::RoundWait::State::kNever) {
    security_->audit("round_failed", {{"round", round_}, {"reason", w.reason}});
    throw Error("aggregator '" + self_.id + "': round " + std::to_string(round_) +
                " can never close: " + w.reason +
                " (see docs/operations.md, \"Quorum and deadlines\")");
  }
  if (w.state == aggregator::RoundWait::State::kAbsentMembers &&
      membership_.absent_logged != round_) {
    membership_.absent_logged = round_;
    log().warn("[agg:{}] round {}: every child still expected delivered; waiting for {} to "
               "rejoin (up to {} s)",
               self_.id, round_, aggregator::join_names(w.waiting_for),
               cfg_.round_timeout.count() / 1000);
  }
}

nlohmann::json Aggregator::Impl::membership_json() const {
  nlohmann::json m = nlohmann::json::object();
  for (const Child& c : down_.children) {
    nlohmann::json e = {{"state", c.member ? "member" : away_name(c.away)}};
    if (!c.is_site) e["member_weight"] = c.member_weight, e["member_sites"] = c.member_sites;
    m[c.id] = e;
  }
  return m;
}

void Aggregator::Impl::restore_membership(const nlohmann::json& m) {
  for (Child& c : down_.children) {
    if (!m.is_object() || !m.contains(c.id) || !m[c.id].is_object()) continue;
    const nlohmann::json& e = m[c.id];
    const std::string state = e.value("state", std::string("member"));
    c.member = state == "member";
    c.away = state == "left"     ? Away::kLeft
             : state == "paused" ? Away::kPaused
             : c.member          ? Away::kNo
                                 : Away::kNotYet;
    if (!c.is_site && e.contains("member_weight") && e["member_weight"].is_number()) {
      c.member_weight = std::clamp(e["member_weight"].get<double>(), 0.0, c.weight);
      c.member_sites = e.value("member_sites", c.member_sites);
    }
  }
}

}  // namespace fedwan
