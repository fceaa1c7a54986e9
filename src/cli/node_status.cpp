#include "cli/node_status.hpp"

#include <utility>

#include <nlohmann/json.hpp>

#include "common/json_depth.hpp"

namespace fedwan::cli {
namespace {

using json = nlohmann::json;

// Longest quote of a node's own text in a reason.
constexpr size_t kQuoteBytes = 64;
// A status nests three deep (children's windows); more is refused before
// the recursive parser sees it.
constexpr size_t kMaxDepth = 16;

const char* type_name(const json& v) {
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// Reads the fields of one JSON object; the first wrong type is kept as the
// reason and the reads after it are harmless.
class FieldReader {
 public:
  FieldReader(const json& object, std::string where, std::string* problem)
      : object_(object), where_(std::move(where)), problem_(problem) {}

  std::optional<uint64_t> count(const char* key) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<uint64_t>();
    return wrong(key, *v, "a whole number >= 0"), std::nullopt;
  }
  std::optional<double> number(const char* key) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_number()) return v->get<double>();
    return wrong(key, *v, "a number"), std::nullopt;
  }
  std::optional<bool> flag(const char* key) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_boolean()) return v->get<bool>();
    return wrong(key, *v, "a boolean"), std::nullopt;
  }
  std::optional<std::string> text(const char* key) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_string()) return v->get<std::string>();
    return wrong(key, *v, "a string"), std::nullopt;
  }
  const json* list(const char* key) {
    const json* v = find(key);
    if (!v) return nullptr;
    if (v->is_array()) return v;
    return wrong(key, *v, "an array"), nullptr;
  }
  const json* object(const char* key) {
    const json* v = find(key);
    if (!v) return nullptr;
    if (v->is_object()) return v;
    return wrong(key, *v, "an object"), nullptr;
  }

 private:
  const json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  void wrong(const char* key, const json& v, const char* wanted) {
    if (problem_->empty()) {
      *problem_ = where_ + "\"" + key + "\" is " + type_name(v) + ", not " + wanted;
    }
  }

  const json& object_;
  std::string where_;
  std::string* problem_;
};

std::string quote(const std::string& s) {
  return "'" + (s.size() > kQuoteBytes ? s.substr(0, kQuoteBytes) + "..." : s) + "'";
}

}  // namespace

StatusReading read_node_status(const std::string& body, const std::string& node_id) {
  StatusReading out;
  if (json_nesting_exceeds(body.data(), body.data() + body.size(), kMaxDepth)) {
    out.malformed = "its status nests too deep";
    return out;
  }
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    out.malformed = "its status is not JSON";
    return out;
  }
  if (!j.is_object()) {
    out.malformed = std::string("its status is ") + type_name(j) + ", not a JSON object";
    return out;
  }
  std::string problem;
  FieldReader f(j, "", &problem);
  const std::optional<std::string> node = f.text("node");
  if (!problem.empty()) {
    out.malformed = problem;
    return out;
  }
  if (!node) {
    out.malformed = "its status names no node";
    return out;
  }
  if (*node != node_id) {
    out.malformed = "answers as " + quote(*node) + ", not " + quote(node_id);
    return out;
  }
  NodeStatus s;
  s.round = f.count("round");
  s.rounds = f.count("rounds");
  s.members = f.count("members");
  s.bytes_sent = f.count("bytes_sent");
  s.bytes_received = f.count("bytes_received");
  s.paused = f.flag("paused").value_or(false);
  if (const json* privacy = f.object("privacy")) {
    FieldReader pf(*privacy, "privacy's ", &problem);
    s.privacy_epsilon = pf.number("epsilon");
    s.privacy_delta = pf.number("delta");
    s.privacy_budget = pf.number("epsilon_budget");
    s.privacy_mode = pf.text("mode");
    s.privacy_clip = pf.number("clip");
  }
  if (const json* children = f.list("children")) {
    for (const json& c : *children) {
      if (!problem.empty()) break;
      if (!c.is_object()) {
        problem = std::string("an entry of \"children\" is ") + type_name(c) + ", not an object";
        break;
      }
      FieldReader cf(c, "a child's ", &problem);
      ChildSeen seen;
      seen.id = cf.text("id").value_or("");
      seen.healthy = cf.flag("healthy");
      seen.last_seen_s = cf.number("last_seen_s");
      seen.membership = cf.text("membership");
      seen.round = cf.count("round");
      seen.refused = cf.count("refused");
      seen.clipped = cf.count("clipped");
      seen.flagged = cf.flag("flagged").value_or(false);
      s.children.push_back(std::move(seen));
    }
  }
  if (!problem.empty()) {
    out.malformed = problem;
    return out;
  }
  out.status = std::move(s);
  return out;
}

}  // namespace fedwan::cli
