// The log level alone, without the logger: for translation units that must
// not see spdlog (its fmt would collide with the fmt a LibTorch 2.x ships in
// its headers, under C++20).
#pragma once

#include <string>

namespace fedwan {

// trace|debug|info|warn|error|off; throws ConfigError on an unknown level.
void set_log_level(const std::string& level);

}  // namespace fedwan
