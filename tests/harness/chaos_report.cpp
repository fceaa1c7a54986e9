#include "harness/chaos_report.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace fedwan::testing {

ChaosReport::~ChaosReport() {
  try {
    flush();
  } catch (...) {
  }
}

std::filesystem::path ChaosReport::default_path() {
  const char* env = std::getenv("FEDWAN_CHAOS_REPORT");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path("chaos_report.json");
}

std::filesystem::path ChaosReport::markdown_path() const {
  std::filesystem::path p = path_;
  if (p.extension() == ".md") return p.string() + ".md";  // never the JSON file itself
  return p.replace_extension(".md");
}

void ChaosReport::add(ChaosRow row) {
  for (ChaosRow& r : pending_) {
    if (r.scenario == row.scenario) {
      r = std::move(row);
      return;
    }
  }
  pending_.push_back(std::move(row));
}

void ChaosReport::flush() {
  if (pending_.empty()) return;
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  const std::string lock_path = path_.string() + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot open the lock file " + lock_path);
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      const int err = errno;
      ::close(fd);
      errno = err;
      fail("cannot lock " + lock_path);
    }
  }
  try {
    std::map<std::string, ChaosRow> rows;
    std::error_code ec;
    if (std::filesystem::exists(path_, ec)) {
      try {
        for (ChaosRow& r : read(path_)) rows[r.scenario] = std::move(r);
      } catch (const std::runtime_error&) {
        std::filesystem::rename(path_, path_.string() + ".corrupt", ec);
      }
    }
    for (const ChaosRow& r : pending_) rows[r.scenario] = r;
    std::vector<ChaosRow> all;
    for (auto& [scenario, r] : rows) all.push_back(std::move(r));
    write_atomically(path_, to_json(all).dump(2) + "\n");
    write_atomically(markdown_path(), markdown(all));
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  pending_.clear();
}

std::vector<ChaosRow> ChaosReport::read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("version") ||
      j["version"] != kVersion || !j.contains("rows") || !j["rows"].is_array()) {
    throw std::runtime_error(path.string() + " is not a " + kFormat + " version " +
                             std::to_string(kVersion) + " file");
  }
  std::vector<ChaosRow> out;
  for (const nlohmann::json& r : j["rows"]) {
    if (!r.is_object() || !r.contains("scenario") || !r["scenario"].is_string()) {
      throw std::runtime_error(path.string() + ": a row without a scenario");
    }
    ChaosRow row;
    row.scenario = r["scenario"].get<std::string>();
    row.mechanism = r.value("mechanism", "");
    if (r.contains("rpo_rounds") && r["rpo_rounds"].is_number_unsigned()) {
      row.rpo_rounds = r["rpo_rounds"].get<uint64_t>();
    }
    if (r.contains("rto_seconds") && r["rto_seconds"].is_number()) {
      row.rto_seconds = r["rto_seconds"].get<double>();
    }
    row.passed = r.value("passed", false);
    row.notes = r.value("notes", "");
    out.push_back(std::move(row));
  }
  return out;
}

nlohmann::json ChaosReport::to_json(const std::vector<ChaosRow>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  for (const ChaosRow& r : rows) {
    arr.push_back({{"scenario", r.scenario},
                   {"mechanism", r.mechanism},
                   {"rpo_rounds", r.rpo_rounds ? nlohmann::json(*r.rpo_rounds) : nullptr},
                   {"rto_seconds", r.rto_seconds ? nlohmann::json(*r.rto_seconds) : nullptr},
                   {"passed", r.passed},
                   {"notes", r.notes}});
  }
  return {{"format", kFormat}, {"version", kVersion}, {"rows", arr}};
}

std::string ChaosReport::markdown(const std::vector<ChaosRow>& rows) {
  std::ostringstream md;
  md << "# fedwan chaos report\n\n"
     << "RPO: rounds of training lost. RTO: seconds from the fault until the federation "
        "made progress again.\n\n"
     << "| Scenario | Mechanism | RPO (rounds) | RTO (s) | Result | Notes |\n"
     << "|---|---|---|---|---|---|\n";
  for (const ChaosRow& r : rows) {
    char rto[32] = "n/a";
    if (r.rto_seconds) std::snprintf(rto, sizeof rto, "%.2f", *r.rto_seconds);
    md << "| " << cell(r.scenario) << " | " << cell(r.mechanism) << " | "
       << (r.rpo_rounds ? std::to_string(*r.rpo_rounds) : "n/a") << " | " << rto << " | "
       << (r.passed ? "pass" : "**FAIL**") << " | " << cell(r.notes) << " |\n";
  }
  return md.str();
}

void ChaosReport::fail(const std::string& what) {
  throw std::runtime_error("ChaosReport: " + what + ": " + std::system_category().message(errno));
}

std::string ChaosReport::cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

void ChaosReport::write_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) fail("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("ChaosReport: cannot rename " + tmp + " to " + path.string());
  }
}

}  // namespace fedwan::testing
