#include "aggregator/round_wait.hpp"

#include <algorithm>
#include <sstream>

namespace fedwan::aggregator {
namespace {

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

bool delivered(const aggregation::RoundAccumulator& acc, uint32_t chunk, uint32_t index) {
  const std::vector<uint32_t> in = acc.contributors(chunk);
  return std::find(in.begin(), in.end(), index) != in.end();
}

}  // namespace

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

RoundWait judge_round_wait(const aggregation::RoundAccumulator& acc,
                           const std::vector<AbsentMember>& absent, double quorum,
                           const std::function<std::string(uint32_t)>& name) {
  RoundWait w;
  if (!acc.is_open() || acc.round_complete()) return w;
  const std::vector<uint32_t> owing = acc.owing_children();
  if (!owing.empty()) {
    w.state = RoundWait::State::kDeliveries;
    for (uint32_t idx : owing) w.waiting_for.push_back(name(idx));
    return w;
  }
  const std::vector<uint32_t> short_chunks = acc.short_chunks();
  if (short_chunks.empty()) return w;  // ready: the caller closes them
  // Nothing is owed: only absent members' weight can close the short chunks.
  std::vector<bool> needed(absent.size(), false);
  for (uint32_t chunk : short_chunks) {
    double could = acc.chunk_weight(chunk);
    bool anyone = !acc.contributors(chunk).empty();  // a mean needs one delivery
    for (size_t i = 0; i < absent.size(); ++i) {
      if (absent[i].weight <= 0 || delivered(acc, chunk, absent[i].index)) continue;
      could += absent[i].weight;
      anyone = true;
      needed[i] = true;
    }
    if (could < acc.min_weight() || !anyone) {
      std::vector<std::string> chunks;
      chunks.reserve(short_chunks.size());
      for (uint32_t c : short_chunks) chunks.push_back(std::to_string(c));
      w.state = RoundWait::State::kNever;
      w.waiting_for.clear();
      w.reason =
          "every child still expected delivered, but chunk(s) " + join_names(chunks) +
          " lack quorum: chunk " + std::to_string(chunk) + " has weight " +
          number(acc.chunk_weight(chunk)) + " of the " + number(acc.min_weight()) +
          " that quorum " + number(quorum) + " of the members' weight needs, and " +
          (could > acc.chunk_weight(chunk)
               ? "the members that could still rejoin would bring it only to " + number(could)
               : std::string("no member that could still deliver it is left"));
      return w;
    }
  }
  w.state = RoundWait::State::kAbsentMembers;
  for (size_t i = 0; i < absent.size(); ++i) {
    if (!needed[i]) continue;
    w.waiting_for.push_back(absent[i].id + " (" + absent[i].why +
                            "; its weight is needed for quorum " + number(quorum) + ")");
  }
  return w;
}

bool standby_live(const StandbyLink& s, StandbyLink::Clock::time_point now,
                  StandbyLink::Clock::duration timeout) {
  return s.linked && s.seen && now - s.heard <= timeout;
}

bool standby_awaited(const StandbyLink& s, StandbyLink::Clock::time_point now,
                     StandbyLink::Clock::duration timeout) {
  if (standby_live(s, now, timeout)) return true;
  return s.linked && !s.seen && !s.warned && now - s.link_opened <= timeout;
}

}  // namespace fedwan::aggregator
