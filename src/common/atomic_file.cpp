#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fedwan/error.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;

constexpr mode_t kPrivateDirMode = 0700;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string size_text(size_t bytes) {
  constexpr size_t kKiB = 1024;
  constexpr size_t kMiB = kKiB * kKiB;
  if (bytes != 0 && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes != 0 && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  return std::to_string(bytes) + " bytes";
}

// 0, or the errno of the failed open or fsync.
int sync_directory(const fs::path& dir) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) return errno;
  return ::fsync(d.fd) == 0 ? 0 : errno;
}

}  // namespace

void throw_file_error(std::string_view action, const fs::path& path, int err) {
  throw ConfigError("cannot " + std::string(action) + " " + path.string() + ": " +
                    std::strerror(err) +
                    "; check that the directory exists and is writable by this user");
}

std::optional<std::string> read_file_if_exists(const fs::path& path,
                                               const ReadFileOptions& options) {
  const std::string action = "read " + options.what;
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw_file_error(action, path, errno);
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_file_error(action, path, errno);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > options.max_bytes) {
      throw ConfigError(options.what + " " + path.string() + " is larger than " +
                        size_text(options.max_bytes) +
                        (options.too_large_hint.empty() ? "" : "; " + options.too_large_hint));
    }
  }
  return out;
}

std::string read_file(const fs::path& path, const ReadFileOptions& options) {
  std::optional<std::string> text = read_file_if_exists(path, options);
  if (!text) throw_file_error("read " + options.what, path, ENOENT);
  return std::move(*text);
}

void write_file_atomic(const fs::path& path, std::string_view bytes, mode_t mode) {
  std::string tmpl = (path.parent_path() / ("." + path.filename().string() + ".XXXXXX")).string();
  Fd f{::mkstemp(tmpl.data())};  // created 0600: a key is never readable by others
  if (f.fd < 0) throw_file_error("create a temporary file for", path, errno);
  bool committed = false;
  struct Unlink {
    const std::string& name;
    const bool& committed;
    ~Unlink() {
      if (!committed) ::unlink(name.c_str());
    }
  } unlink_guard{tmpl, committed};

  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_file_error("write", path, errno);
    done += static_cast<size_t>(n);
  }
  if (::fchmod(f.fd, mode) != 0) throw_file_error("set the mode of", path, errno);
  if (::fsync(f.fd) != 0) throw_file_error("sync", path, errno);
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) throw_file_error("close", path, errno);
  if (::rename(tmpl.c_str(), path.c_str()) != 0) throw_file_error("replace", path, errno);
  committed = true;
  // Make the rename durable too: a revocation reported done must survive a
  // power cut. A failure here loses nothing already written.
  (void)sync_directory(path.has_parent_path() ? path.parent_path() : fs::path("."));
}

void fsync_directory(const fs::path& dir) {
  const int err = sync_directory(dir);
  if (err != 0) throw_file_error("sync directory", dir, err);
}

void make_private_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_file_error("create directory", dir, ec.value());
  if (::chmod(dir.c_str(), kPrivateDirMode) != 0) throw_file_error("set the mode of", dir, errno);
}

}  // namespace fedwan
