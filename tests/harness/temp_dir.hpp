// A private temporary directory for a test, removed with everything in it
// at scope exit, and a sorted listing of a directory. Only the process that
// made it removes it: a forked child that exits (and so runs the static
// destructors it inherited, e.g. TestPki's) must not take the directory
// from under the tests still running in its parent.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace fedwan::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fedwan-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
  pid_t owner_ = ::getpid();
};

// The names in `dir`, sorted; empty when it does not exist.
inline std::vector<std::string> entries(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The bytes of the file at `p` (empty when it cannot be read).
inline std::vector<uint8_t> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Replaces the file at `p` with the first `n` of `bytes` (all by default).
inline void spit(const std::filesystem::path& p, const std::vector<uint8_t>& bytes,
                 size_t n = static_cast<size_t>(-1)) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(std::min(n, bytes.size())));
}

}  // namespace fedwan::testing
