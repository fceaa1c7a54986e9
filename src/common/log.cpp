#include "common/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include "fedwan/error.hpp"

namespace fedwan {
namespace {

std::atomic<uint64_t> g_write_failures{0};

// Formats each message with its payload escaped, then writes the line to
// stderr in one fwrite, checked.
class EscapingStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string escaped =
        escape_log_text(std::string_view(msg.payload.data(), msg.payload.size()));
    spdlog::details::log_msg safe = msg;
    safe.payload = spdlog::string_view_t(escaped.data(), escaped.size());
    spdlog::memory_buf_t line;
    formatter_->format(safe, line);
    if (std::fwrite(line.data(), 1, line.size(), stderr) != line.size()) {
      g_write_failures.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void flush_() override {
    if (std::fflush(stderr) != 0) g_write_failures.fetch_add(1, std::memory_order_relaxed);
  }
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

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<EscapingStderrSink>();
    auto l = std::make_shared<spdlog::logger>("fedwan", sink);
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
    const char* env = std::getenv("FEDWAN_LOG_LEVEL");
    l->set_level(env ? spdlog::level::from_str(env) : spdlog::level::warn);
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
