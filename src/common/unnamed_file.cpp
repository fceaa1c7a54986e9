#include "common/unnamed_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <system_error>

namespace fedwan {

int open_unnamed_file(const std::filesystem::path& dir, std::string* where) {
  std::filesystem::path d = dir;
  std::error_code ec;
  if (d.empty()) {
    d = std::filesystem::temp_directory_path(ec);
    if (ec) d = "/tmp";
  } else {
    std::filesystem::create_directories(d, ec);  // a checkpoint directory before its first
  }
  *where = d.string();
  int fd = ::open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string name = (d / ".fedwan-unnamed.XXXXXX").string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  return fd;
}

}  // namespace fedwan
