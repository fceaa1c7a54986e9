#include "costs/cost_recorder.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/errno_text.hpp"
#include "common/keep_alive.hpp"
#include "common/log.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"
#include "security/node_key.hpp"

namespace fedwan::costs {
namespace {

// One write(2) of the whole line with O_APPEND: lines of a restarted node
// never interleave with a torn one of its earlier life.
bool append_line(const std::string& path, const std::string& line, std::string* why) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = errno_text(errno);
    return false;
  }
  (void)::fchmod(fd, 0600);  // a file an earlier release made 0644
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int write_err = errno;
  // A disk slow to flush holds the fsync: a node's loop goes on beating
  // meanwhile (common/keep_alive.hpp).
  const int sync_err = n == static_cast<ssize_t>(line.size())
                           ? KeepAlive::during([fd] { return ::fsync(fd) == 0 ? 0 : errno; })
                           : 0;
  ::close(fd);
  if (n < 0) {
    *why = errno_text(write_err);
  } else if (n != static_cast<ssize_t>(line.size())) {
    *why = "short write";
  } else if (sync_err != 0) {
    *why = "fsync: " + errno_text(sync_err);
  }
  return n == static_cast<ssize_t>(line.size()) && sync_err == 0;
}

}  // namespace

CostRecorder::CostRecorder(std::string path, std::string job, std::string node, std::string role,
                           std::shared_ptr<const security::NodeKey> key)
    : path_(std::move(path)),
      job_(std::move(job)),
      node_(std::move(node)),
      role_(std::move(role)),
      key_(std::move(key)),
      start_(std::chrono::system_clock::now()) {}

std::string CostRecorder::line(uint64_t round, bool contributed,
                               std::chrono::system_clock::time_point now) const {
  nlohmann::json j = {{"v", kCostSchemaVersion}, {"job", job_},    {"node", node_},
                      {"role", role_},           {"round", round}, {"start", utc_text_ms(start_)},
                      {"end", utc_text_ms(now)}};
  if (role_ == "site") {
    j["train_seconds"] = train_seconds_;
    j["devices"] = devices_;
    j["device"] = device_;
    j["contributed"] = contributed;
  }
  nlohmann::json links = nlohmann::json::object();
  for (const auto& [peer, b] : links_) links[peer] = {{"sent", b.sent}, {"received", b.received}};
  j["links"] = links;
  if (key_) {
    const std::string text = cost_record_signed_text(j);
    j["sig"] = security::base64_encode(key_->sign(kCostRecordDomain, text));
    j["cert"] = security::base64_encode(key_->cert_der());
  }
  return j.dump() + "\n";
}

void CostRecorder::round_ended(uint64_t round, bool contributed) {
  if (path_.empty()) return;
  const auto now = std::chrono::system_clock::now();
  std::string why;
  bool ok = false;
  try {
    ok = append_line(path_, line(round, contributed, now), &why);
  } catch (const Error& e) {
    why = e.what();  // the key could not sign
  }
  if (!ok) {
    if (!failing_) {
      log().warn("[{}] could not write its cost record of round {} to {}: {}; its counts go into "
                 "the next record",
                 node_, round, path_, why);
    }
    failing_ = true;
    return;
  }
  failing_ = false;
  links_.clear();
  train_seconds_ = 0;
  start_ = now;
}

}  // namespace fedwan::costs
