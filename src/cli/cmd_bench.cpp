// `fedwan bench`: the WAN benchmark harness (benchmarks/wan/fedwan_bench, a
// Python package: namespaces, the link emulator, the federation's processes,
// reports and plots). This command finds the package and the binaries next
// to this one and hands every argument over to it.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "common/errno_text.hpp"

namespace fedwan::cli {
namespace {

namespace fs = std::filesystem;

fs::path own_directory() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : exe.parent_path();
}

// Where the fedwan_bench package lives: $FEDWAN_BENCH_DIR, the installed
// share/fedwan/bench, or the source tree this binary was built from.
std::string bench_directory(const fs::path& bin) {
  if (const char* dir = std::getenv("FEDWAN_BENCH_DIR")) return dir;
  for (const fs::path& candidate :
       {bin / ".." / "share" / "fedwan" / "bench", fs::path(FEDWAN_SOURCE_BENCH_DIR)}) {
    if (fs::exists(candidate / "fedwan_bench" / "__main__.py")) return candidate.string();
  }
  return {};
}

int run_bench(const std::vector<std::string>& args) {
  const fs::path bin = own_directory();
  const std::string dir = bench_directory(bin);
  if (dir.empty()) {
    std::cerr << "fedwan bench: the harness (fedwan_bench) is not installed next to this "
                 "binary; set FEDWAN_BENCH_DIR to the directory that holds it\n";
    return 2;
  }
  const char* python_env = std::getenv("FEDWAN_PYTHON");
  const std::string python = python_env != nullptr ? python_env : "python3";
  const char* old_path = std::getenv("PYTHONPATH");
  const std::string path = dir + (old_path != nullptr ? ":" + std::string(old_path) : "");
  ::setenv("PYTHONPATH", path.c_str(), 1);
  if (std::getenv("FEDWAN_BIN_DIR") == nullptr) ::setenv("FEDWAN_BIN_DIR", bin.c_str(), 1);
  std::vector<std::string> argv = {python, "-m", "fedwan_bench"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  ::execvp(python.c_str(), c_argv.data());
  std::cerr << "fedwan bench: cannot run " << python << ": " << errno_text(errno)
            << " (install python3, or set FEDWAN_PYTHON)\n";
  return 2;
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "run federations under emulated WAN links and report round time, bytes, utilisation and "
      "memory against baselines (`fedwan bench run --help`; docs/benchmarks.md)");
  bench->prefix_command();  // every argument after `bench` goes to the harness
  bench->set_help_flag();   // so does --help
  bench->callback([bench, exit_code] { *exit_code = run_bench(bench->remaining()); });
}

}  // namespace fedwan::cli
