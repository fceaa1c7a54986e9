#include "costs/cost_ledger.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "common/json_depth.hpp"
#include "common/terminal_text.hpp"
#include "fedwan/error.hpp"
#include "fedwan/topology.hpp"
#include "security/node_key.hpp"

namespace fedwan::costs {
namespace {

using nlohmann::json;

const char* const kRoles[] = {"site", "region", "root"};
const char* const kDeviceKinds[] = {"cpu", "gpu"};

template <size_t N>
bool one_of(const std::string& s, const char* const (&names)[N]) {
  return std::find(std::begin(names), std::end(names), s) != std::end(names);
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
// days_from_civil).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

std::string printable(const std::string& s) { return cost_printable(s); }

std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Deeper than any record: refused before nlohmann's recursive parser sees it.
bool nested_deeper_than(const std::string& s, size_t limit) {
  return json_nesting_exceeds(s.data(), s.data() + s.size(), limit);
}

class RecordReader {
 public:
  RecordReader(const json& j, const std::string& origin) : j_(j), origin_(origin) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(origin_ + ": " + what);
  }
  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  const json& need(const char* key) const {
    const json* v = find(key);
    if (!v) fail(std::string("no \"") + key + "\" (a cost record of schema version 1 has it)");
    return *v;
  }
  std::string str(const char* key) const {
    const json& v = need(key);
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
      fail(std::string("\"") + key + "\" must be a non-empty string, got " + shown(v));
    }
    return v.get<std::string>();
  }
  uint64_t u64(const json& v, const std::string& what) const {
    if (!v.is_number_unsigned()) {
      fail("\"" + what + "\" must be a non-negative integer, got " + shown(v));
    }
    return v.get<uint64_t>();
  }

 private:
  const json& j_;
  const std::string& origin_;
};

json parse_record_object(const std::string& line, const std::string& origin) {
  if (line.size() > kCostMaxLineBytes) {
    throw ConfigError(origin + ": line longer than 1 MiB: not a cost record");
  }
  if (nested_deeper_than(line, 16)) {
    throw ConfigError(origin + ": nested deeper than a cost record can be");
  }
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && bracket != std::string::npos) {
      what = what.substr(bracket + 2);
    }
    throw ConfigError(origin + ": not valid JSON: " + printable(what));
  }
  if (!j.is_object()) throw ConfigError(origin + ": not a JSON object, got " + shown(j));
  return j;
}

int schema_version(const RecordReader& in) {
  const json& v = in.need("v");
  if (!v.is_number_integer()) in.fail("\"v\" must be an integer, got " + shown(v));
  if (!v.is_number_unsigned() || v.get<uint64_t>() < 1 ||
      v.get<uint64_t>() > static_cast<uint64_t>(kCostSchemaVersion)) {
    in.fail("schema version " + shown(v) +
            " is not supported: this fedwan reads cost records of versions 1 to " +
            std::to_string(kCostSchemaVersion) + " (use the fedwan release that wrote them)");
  }
  return static_cast<int>(v.get<uint64_t>());
}

// Whose record of which round; `r->version` is already read.
void read_identity(const RecordReader& in, CostRecord* r) {
  if (r->version >= 2) r->job = in.str("job");
  r->node = in.str("node");
  r->role = in.str("role");
  if (!one_of(r->role, kRoles)) {
    in.fail("\"role\" must be site, region or root, got " + shown(in.need("role")));
  }
  r->round = in.u64(in.need("round"), "round");
}

void read_times(const RecordReader& in, CostRecord* r) {
  r->start = in.str("start");
  r->end = in.str("end");
  std::string why;
  if (!parse_utc(r->start, &r->start_time, &why)) {
    in.fail("\"start\" " + shown(in.need("start")) + " " + why);
  }
  if (!parse_utc(r->end, &r->end_time, &why)) {
    in.fail("\"end\" " + shown(in.need("end")) + " " + why);
  }
  if (r->end_time < r->start_time) {
    in.fail("\"end\" " + r->end + " is before \"start\" " + r->start);
  }
}

// The optional training fields; absent, they keep CostRecord's defaults.
void read_usage(const RecordReader& in, CostRecord* r) {
  if (const json* ts = in.find("train_seconds")) {
    if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0) {
      in.fail("\"train_seconds\" must be a non-negative number, got " + shown(*ts));
    }
    r->train_seconds = ts->get<double>();
  }
  if (const json* n = in.find("devices")) r->devices = in.u64(*n, "devices");
  if (const json* dev = in.find("device")) {
    if (!dev->is_string() || !one_of(dev->get<std::string>(), kDeviceKinds)) {
      in.fail("\"device\" must be cpu or gpu, got " + shown(*dev));
    }
    r->device = dev->get<std::string>();
  }
  if (const json* c = in.find("contributed")) {
    if (!c->is_boolean()) in.fail("\"contributed\" must be true or false, got " + shown(*c));
    r->contributed = c->get<bool>();
  }
}

void read_links(const RecordReader& in, CostRecord* r) {
  const json* links = in.find("links");
  if (!links) return;
  if (!links->is_object()) {
    in.fail("\"links\" must be an object of peer: {sent, received}, got " + shown(*links));
  }
  for (const auto& item : links->items()) {
    const std::string ctx = "links." + item.key();
    const json& l = item.value();
    if (!l.is_object() || !l.contains("sent") || !l.contains("received")) {
      in.fail("\"" + ctx + "\" must be {\"sent\": bytes, \"received\": bytes}, got " + shown(l));
    }
    r->links[item.key()] = {in.u64(l["sent"], ctx + ".sent"),
                            in.u64(l["received"], ctx + ".received")};
  }
}

// Sets `r->device_us` from the fields read_usage() read.
void count_device_time(const RecordReader& in, CostRecord* r) {
  // Whole microseconds, so that every sum of them is exact.
  const double us = std::round(r->train_seconds * 1e6);
  if (us >= 9.2e18 ||
      __builtin_mul_overflow(static_cast<uint64_t>(us), r->devices, &r->device_us)) {
    in.fail("\"train_seconds\" x \"devices\" is too large to be a round's device time");
  }
  if (r->device_us > 0 && r->device.empty()) {
    in.fail("no \"device\": cpu or gpu is needed to price " + number(r->train_seconds) + " s on " +
            std::to_string(r->devices) + " device(s)");
  }
}

// "sig" and "cert" come together or not at all; `j` is the whole record,
// whose canonical text the signature covers.
void read_signature(const RecordReader& in, const json& j, CostRecord* r) {
  const json* sig = in.find("sig");
  const json* cert = in.find("cert");
  if (!sig && !cert) return;
  const auto b64 = [&](const json* field, const char* name, size_t max) {
    std::optional<std::vector<uint8_t>> bytes;
    if (field && field->is_string())
      bytes = security::base64_decode(field->get<std::string>(), max);
    if (!bytes || bytes->empty()) in.fail(std::string("\"") + name + "\" must be base64");
    return *bytes;
  };
  r->signature = b64(sig, "sig", security::kMaxSignatureBytes);
  r->cert_der = b64(cert, "cert", security::kMaxSignerCertBytes);
  r->signed_text = cost_record_signed_text(j);
}

}  // namespace

bool parse_utc(const std::string& t, UtcTime* out, std::string* why) {
  // YYYY-MM-DDTHH:MM:SS[.fffffffff]Z
  const auto digits = [&](size_t at, size_t n, unsigned* v) {
    if (at + n > t.size()) return false;
    *v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return false;
      *v = *v * 10 + static_cast<unsigned>(t[i] - '0');
    }
    return true;
  };
  unsigned y, mo, d, h, mi, s;
  const bool shape = t.size() >= 20 && digits(0, 4, &y) && t[4] == '-' && digits(5, 2, &mo) &&
                     t[7] == '-' && digits(8, 2, &d) && t[10] == 'T' && digits(11, 2, &h) &&
                     t[13] == ':' && digits(14, 2, &mi) && t[16] == ':' && digits(17, 2, &s);
  size_t i = 19;
  uint32_t nanos = 0;
  bool fraction_ok = true;
  if (shape && i < t.size() && t[i] == '.') {
    size_t n = 0;
    for (++i; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i, ++n) {
      if (n < 9) nanos = nanos * 10 + static_cast<uint32_t>(t[i] - '0');
    }
    fraction_ok = n >= 1 && n <= 9;
    for (; n < 9; ++n) nanos *= 10;
  }
  if (!shape || !fraction_ok || i + 1 != t.size() || t[i] != 'Z') {
    *why = "is not a UTC time like 2026-11-25T07:00:12.600Z (ISO-8601, ending in Z)";
    return false;
  }
  static const unsigned kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] + (mo == 2 && leap) || h > 23 || mi > 59 ||
      s > 59) {
    *why = "is not a valid date and time";
    return false;
  }
  out->seconds = days_from_civil(y, mo, d) * 86400 + int64_t{h} * 3600 + int64_t{mi} * 60 + s;
  out->nanos = nanos;
  return true;
}

std::string CostRecord::first_difference(const CostRecord& o) const {
  const auto differ = [](const std::string& what, const std::string& a, const std::string& b) {
    return what + " (" + a + " vs " + b + ")";
  };
  if (job != o.job) return differ("job", job, o.job);
  if (role != o.role) return differ("role", role, o.role);
  if (start != o.start) return differ("start", start, o.start);
  if (end != o.end) return differ("end", end, o.end);
  if (train_seconds != o.train_seconds) {
    return differ("train_seconds", number(train_seconds), number(o.train_seconds));
  }
  if (devices != o.devices) {
    return differ("devices", std::to_string(devices), std::to_string(o.devices));
  }
  if (device != o.device) return differ("device", device, o.device);
  if (contributed != o.contributed) {
    return differ("contributed", contributed ? "true" : "false", o.contributed ? "true" : "false");
  }
  for (const auto& [peer, bytes] : links) {
    const auto it = o.links.find(peer);
    if (it == o.links.end()) return "links (" + peer + " only in the first)";
    if (bytes.sent != it->second.sent) {
      return differ("links." + peer + ".sent", std::to_string(bytes.sent),
                    std::to_string(it->second.sent));
    }
    if (bytes.received != it->second.received) {
      return differ("links." + peer + ".received", std::to_string(bytes.received),
                    std::to_string(it->second.received));
    }
  }
  for (const auto& link : o.links) {
    if (!links.count(link.first)) return "links (" + link.first + " only in the second)";
  }
  return "";
}

CostRecord parse_cost_record(const std::string& line, const std::string& origin) {
  const json j = parse_record_object(line, origin);
  const RecordReader in(j, origin);
  CostRecord r;
  r.version = schema_version(in);
  r.origin = origin;
  read_identity(in, &r);
  read_times(in, &r);
  read_usage(in, &r);
  read_links(in, &r);
  count_device_time(in, &r);
  read_signature(in, j, &r);
  return r;
}

uint64_t CostRecord::bytes_sent() const {
  uint64_t n = 0;
  for (const auto& link : links) {
    if (__builtin_add_overflow(n, link.second.sent, &n)) return UINT64_MAX;
  }
  return n;
}

std::string cost_printable(const std::string& s) { return terminal_text(s); }

CostLedger::CostLedger(CostTrust trust) : trust_(std::move(trust)) {
  if (!trust_.ca && !trust_.on_their_word) {
    throw ConfigError("cost records are billed either against the federation CA (each record "
                      "signed by its node) or explicitly on their word; neither was chosen");
  }
}

std::optional<std::string> CostLedger::untrusted(const CostRecord& r) const {
  if (!trust_.job.empty() && r.version >= 2 && r.job != trust_.job) {
    return "a record of job '" + printable(r.job) + "'; this bill is of job '" +
           printable(trust_.job) + "'";
  }
  if (!trust_.ca) return std::nullopt;  // on their word
  if (!r.is_signed()) {
    return r.version < 2 ? "unsigned (schema 1, written by an earlier release): its node "
                           "cannot be verified"
                         : "unsigned (its node ran without credentials): its node cannot be "
                           "verified";
  }
  security::ExpectedSigner who;
  who.node_id = r.node;
  Role role = Role::kSite;
  if (r.role == "root") role = Role::kRoot;
  if (r.role == "region") role = Role::kRegion;
  who.role = role;
  who.job = r.job;
  const std::optional<std::string> bad =
      trust_.ca->verify(r.cert_der, kCostRecordDomain, r.signed_text, r.signature, who);
  if (!bad) return std::nullopt;
  return "not signed by " + printable(r.node) + " (" + printable(*bad) +
         "): a record is billed only to the node whose key signed it";
}

void CostLedger::add(CostRecord r) {
  ++lines_read_;
  if (std::optional<std::string> why = untrusted(r)) {
    refusals_.push_back({r.origin, r.node, r.round, *why});
    return;
  }
  if (trust_.ca) ++verified_;
  const auto role = roles_.find(r.node);
  if (role == roles_.end()) {
    roles_[r.node] = {r.role, r.origin};
  } else if (role->second.first != r.role) {
    refusals_.push_back({r.origin, r.node, r.round,
                         "node " + printable(r.node) + " is a " + r.role + " here but a " +
                             role->second.first + " at " + role->second.second +
                             ": one node has one role"});
    return;
  }
  jobs_.insert(r.job);
  auto key = std::make_pair(r.node, r.round);
  const auto seen = records_.find(key);
  if (seen == records_.end()) {
    records_.emplace(std::move(key), std::move(r));
    return;
  }
  const std::string diff = seen->second.first_difference(r);
  if (diff.empty()) {
    ++duplicates_;  // the node wrote the round again after a restart, or a file came twice
    return;
  }
  // The record claiming more is billed; a tie goes to the first read.
  const auto weight = [](const CostRecord& x) {
    return std::make_pair(x.device_us, x.bytes_sent());
  };
  const bool replace = weight(seen->second) < weight(r);
  CostConflict c{r.node, r.round, replace ? r.origin : seen->second.origin,
                 replace ? seen->second.origin : r.origin, printable(diff)};
  conflicts_.push_back(std::move(c));
  if (replace) seen->second = std::move(r);
}

void CostLedger::read(std::istream& in, const std::string& name) {
  // Line by line, never holding more than one line of the limit.
  std::string line;
  uint64_t line_no = 0;
  bool too_long = false;
  const auto take = [&] {
    const std::string origin = name + ":" + std::to_string(++line_no);
    if (too_long) {
      refusals_.push_back({origin, "", std::nullopt, "line longer than 1 MiB: not a cost record"});
    } else {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") != std::string::npos) {
        try {
          add(parse_cost_record(line, origin));
        } catch (const ConfigError& e) {
          std::string why = e.what();
          if (why.rfind(origin + ": ", 0) == 0) why = why.substr(origin.size() + 2);
          refusals_.push_back({origin, "", std::nullopt, why});
        }
      }
    }
    too_long = false;
    line.clear();
  };
  char block[1 << 16];
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    const std::streamsize got = in.gcount();
    for (std::streamsize i = 0; i < got; ++i) {
      if (block[i] == '\n') {
        take();
      } else if (!too_long) {
        line += block[i];
        if (line.size() > kCostMaxLineBytes) {
          too_long = true;
          line.clear();
        }
      }
    }
  }
  if (!line.empty() || too_long) take();
  if (in.bad()) throw ConfigError("cannot read " + name);
}

}  // namespace fedwan::costs
