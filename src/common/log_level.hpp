// The log level alone, without the logger: for translation units that must
// not see spdlog (its fmt would collide with the fmt a LibTorch 2.x ships in
// its headers, under C++20).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fedwan {

// trace|debug|info|warn|error|off; throws ConfigError on an unknown level.
void set_log_level(const std::string& level);

// "text" (the default: `time level [node round N] message`) or "json" (one
// object per line: time, level, node, round, msg); throws ConfigError on
// anything else.
void set_log_format(const std::string& format);

// Writes `text` as a log line of `level` ("info", "warning", "error")
// whatever the level filter, in the log's format: lines a command always
// prints (what a node trains on, that it stopped, its alarms).
void log_always(const std::string& level, const std::string& text);

// The node a process runs, for lines logged outside any LogScope (the CLI
// sets it; in-process federations leave it empty).
void set_log_node(const std::string& node);

// While it lives, lines logged on this thread carry `node` and the value of
// `*round` at the time of the line (read on this thread; null: no round).
// Scopes nest; the innermost wins.
class LogScope {
 public:
  LogScope(const std::string& node, const uint64_t* round);
  ~LogScope();
  // What a line logged now in this scope carries.
  void describe(std::string* node, std::optional<uint64_t>* round) const;
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

 private:
  std::string node_;
  const uint64_t* round_;
  const LogScope* outer_;
};

}  // namespace fedwan
