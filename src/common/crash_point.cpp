#include "common/crash_point.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace fedwan {
namespace {

struct Spec {
  std::string name;
  long n = 1;  // after '@': the hit that crashes, the milliseconds a stall sleeps
};

Spec read_spec(const char* variable) {
  Spec out;
  const char* env = std::getenv(variable);
  if (env == nullptr) return out;
  std::string v(env);
  const size_t at = v.find('@');
  out.name = v.substr(0, at);
  if (at != std::string::npos) out.n = std::max(1L, std::strtol(v.c_str() + at + 1, nullptr, 10));
  return out;
}

const Spec& spec() {
  static const Spec s = read_spec("FEDWAN_CRASH_POINT");
  return s;
}

std::atomic<long> hits{0};

}  // namespace

void crash_point(std::string_view name) {
  const Spec& s = spec();
  if (s.name.empty() || name != s.name) return;
  if (hits.fetch_add(1) + 1 == s.n) ::kill(::getpid(), SIGKILL);
}

void stall_point(std::string_view name) {
  static const Spec s = read_spec("FEDWAN_STALL_POINT");
  if (s.name.empty() || name != s.name) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(s.n));
}

}  // namespace fedwan
