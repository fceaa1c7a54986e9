#include "common/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <nlohmann/json.hpp>

#include "fedwan/error.hpp"

namespace fedwan {
namespace {

std::atomic<uint64_t> g_write_failures{0};
std::atomic<bool> g_json{false};
std::mutex g_node_mu;
std::string g_process_node;  // guarded by g_node_mu

thread_local const LogScope* t_scope = nullptr;

// The node and round of a line logged now, on this thread.
void log_context(std::string* node, std::optional<uint64_t>* round);

// Formats each message with its payload escaped, then writes the line to
// stderr in one fwrite, checked.
class EscapingStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    std::string node;
    std::optional<uint64_t> round;
    log_context(&node, &round);
    std::string out;
    if (g_json.load(std::memory_order_relaxed)) {
      // The time as the text format writes it; nlohmann escapes the rest
      // (control characters included) and replaces invalid UTF-8.
      spdlog::details::log_msg bare = msg;
      bare.payload = spdlog::string_view_t();
      spdlog::memory_buf_t stamp;
      time_formatter_.format(bare, stamp);
      std::string time(stamp.data(), stamp.size());
      while (!time.empty() && (time.back() == '\n' || time.back() == '\r')) time.pop_back();
      nlohmann::json j = {{"time", time},
                          {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                                                spdlog::level::to_string_view(msg.level).size())},
                          {"node", node.empty() ? nlohmann::json(nullptr) : nlohmann::json(node)},
                          {"round", round ? nlohmann::json(*round) : nlohmann::json(nullptr)},
                          {"msg", std::string(text)}};
      out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    } else {
      std::string escaped;
      if (!node.empty()) {
        escaped = "[" + escape_log_text(node) +
                  (round ? " round " + std::to_string(*round) : std::string()) + "] ";
      }
      escaped += escape_log_text(text);
      spdlog::details::log_msg safe = msg;
      safe.payload = spdlog::string_view_t(escaped.data(), escaped.size());
      spdlog::memory_buf_t line;
      formatter_->format(safe, line);
      out.assign(line.data(), line.size());
    }
    if (std::fwrite(out.data(), 1, out.size(), stderr) != out.size()) {
      g_write_failures.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void flush_() override {
    if (std::fflush(stderr) != 0) g_write_failures.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  spdlog::pattern_formatter time_formatter_{"%Y-%m-%dT%H:%M:%S.%e"};
};

void append_escape(std::string& out, const char* fmt, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, fmt, v);
  out += buf;
}

}  // namespace

std::string escape_log_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      append_escape(out, "\\x%02x", c);
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      // C1 controls in UTF-8: some terminals act on them like on ESC.
      append_escape(out, "\\u%04x", static_cast<unsigned char>(text[i + 1]));
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

uint64_t log_write_failures() { return g_write_failures.load(std::memory_order_relaxed); }

namespace {

void log_context(std::string* node, std::optional<uint64_t>* round) {
  if (t_scope != nullptr) {
    t_scope->describe(node, round);
    return;
  }
  std::lock_guard<std::mutex> lock(g_node_mu);
  *node = g_process_node;
}

}  // namespace

LogScope::LogScope(const std::string& node, const uint64_t* round)
    : node_(node), round_(round), outer_(t_scope) {
  t_scope = this;
}

LogScope::~LogScope() { t_scope = outer_; }

void LogScope::describe(std::string* node, std::optional<uint64_t>* round) const {
  *node = node_;
  if (round_ != nullptr) *round = *round_;
}

void log_always(const std::string& level, const std::string& text) {
  spdlog::logger& l = log();
  const spdlog::level::level_enum lv = spdlog::level::from_str(level);
  const spdlog::details::log_msg msg(l.name(), lv == spdlog::level::off ? spdlog::level::info : lv,
                                     spdlog::string_view_t(text.data(), text.size()));
  for (auto& sink : l.sinks()) sink->log(msg);
  l.flush();
}

void set_log_node(const std::string& node) {
  std::lock_guard<std::mutex> lock(g_node_mu);
  g_process_node = node;
}

void set_log_format(const std::string& format) {
  if (format != "text" && format != "json") {
    throw ConfigError("unknown log format '" + format + "'; use text or json");
  }
  g_json.store(format == "json");
}

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<EscapingStderrSink>();
    auto l = std::make_shared<spdlog::logger>("fedwan", sink);
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
    const char* env = std::getenv("FEDWAN_LOG_LEVEL");
    l->set_level(env ? spdlog::level::from_str(env) : spdlog::level::warn);
    const char* format = std::getenv("FEDWAN_LOG_FORMAT");
    if (format != nullptr && std::string(format) == "json") g_json.store(true);
    // Errors and warnings reach the file at once (a crash loses no cause).
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

void set_log_level(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw ConfigError("unknown log level '" + level +
                      "'; use trace, debug, info, warn, error or off");
  }
  log().set_level(parsed);
}

}  // namespace fedwan
