// The message of the error a test's call throws, for assertions on what a
// user is told.
#pragma once

#include <string>
#include <utility>

#include "fedwan/error.hpp"

namespace fedwan::testing {

// The message of the E `f` throws ("" when it throws none; any other
// exception goes through).
template <typename E, typename F>
std::string error_message(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

template <typename F>
std::string config_error(F&& f) {
  return error_message<ConfigError>(std::forward<F>(f));
}

template <typename F>
std::string crypto_error(F&& f) {
  return error_message<CryptoError>(std::forward<F>(f));
}

}  // namespace fedwan::testing
