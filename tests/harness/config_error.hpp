// The message of the ConfigError (or CryptoError) a test's call throws, for
// assertions on what a user is told.
#pragma once

#include <string>

#include "fedwan/error.hpp"

namespace fedwan::testing {

// The message of the ConfigError `f` throws ("" when it throws none).
template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The message of the CryptoError `f` throws ("" when it throws none).
template <typename F>
std::string crypto_error(F&& f) {
  try {
    f();
  } catch (const CryptoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace fedwan::testing
