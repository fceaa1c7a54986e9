#include "common/log.hpp"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "fedwan/error.hpp"

namespace fedwan {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("fedwan");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    const char* env = std::getenv("FEDWAN_LOG_LEVEL");
    l->set_level(env ? spdlog::level::from_str(env) : spdlog::level::warn);
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
