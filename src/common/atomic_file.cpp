#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/errno_text.hpp"
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
  throw ConfigError("cannot " + std::string(action) + " " + path.string() + ": " + errno_text(err) +
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

AtomicFileWriter::AtomicFileWriter(fs::path path, mode_t mode, FailFn fail)
    : path_(std::move(path)), mode_(mode), fail_(std::move(fail)) {
  temp_ = (path_.parent_path() / ("." + path_.filename().string() + ".XXXXXX")).string();
  fd_ = ::mkstemp(temp_.data());  // created 0600: a key is never readable by others
  if (fd_ < 0) failed("create a temporary file for", errno);
  created_ = true;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (created_ && !committed_) ::unlink(temp_.c_str());
}

void AtomicFileWriter::failed(std::string_view action, int err) const {
  if (fail_) fail_(action, err);
  throw_file_error(action, path_, err);
}

void AtomicFileWriter::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    // Modest pieces keep each write(2) bounded for very large files.
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{4} << 20));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) failed("write", errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w =
        ::pwrite(fd_, p, std::min<size_t>(n, size_t{4} << 20), static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) failed("write", errno);
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void AtomicFileWriter::commit(bool require_durable_rename,
                              const std::function<void(std::string_view)>& on_step) {
  if (on_step) on_step("written");
  if (::fchmod(fd_, mode_) != 0) failed("set the mode of", errno);
  if (::fsync(fd_) != 0) failed("sync", errno);
  if (on_step) on_step("synced");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) failed("close", errno);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) failed("replace", errno);
  committed_ = true;
  if (on_step) on_step("renamed");
  // Make the rename durable too: a revocation or checkpoint reported done
  // must survive a power cut.
  const int err = sync_directory(path_.has_parent_path() ? path_.parent_path() : fs::path("."));
  if (err != 0 && require_durable_rename) failed("sync directory of", err);
}

void write_file_atomic(const fs::path& path, std::string_view bytes, mode_t mode) {
  AtomicFileWriter w(path, mode);
  w.write(bytes.data(), bytes.size());
  // A failure of the final directory fsync loses nothing already written.
  w.commit();
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
