// Launching and reaping child processes in tests, with a deadline.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/loopback_port.hpp"

namespace fedwan::testing {

// A loopback TCP port for a node to listen on, kept off every other
// process's path (common/loopback_port.hpp): outside the ephemeral range,
// free when chosen, reserved for this test process.
inline int free_tcp_port() { return reserve_loopback_port(); }

// Runs `exe args` with stderr and stdout sent to `log` (appended to when
// `append`), with `env` added to the environment.
inline pid_t spawn_process(const std::string& exe, const std::vector<std::string>& args,
                           const std::string& log,
                           const std::vector<std::pair<std::string, std::string>>& env = {},
                           bool append = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    FILE* f = std::fopen(log.c_str(), append ? "a" : "w");
    if (f) {
      ::dup2(fileno(f), STDOUT_FILENO);
      ::dup2(fileno(f), STDERR_FILENO);
    }
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for every pid until the deadline, then kills the rest. Returns the
// exit codes (-1 for killed or signalled).
inline std::vector<int> wait_processes(const std::vector<pid_t>& pids,
                                       std::chrono::seconds timeout) {
  std::vector<int> codes(pids.size(), -2);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t left = pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -2) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        --left;
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (codes[i] == -2) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], nullptr, 0);
      codes[i] = -1;
    }
  }
  return codes;
}

// A model written by `fedwan ... --out` (raw little-endian fp32).
inline std::vector<float> read_model(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// A node's log, for failure messages.
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace fedwan::testing
