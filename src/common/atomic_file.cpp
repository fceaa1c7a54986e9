#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/crash_point.hpp"
#include "common/errno_text.hpp"
#include "common/keep_alive.hpp"
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
  return KeepAlive::during([&] { return ::fsync(d.fd) == 0 ? 0 : errno; });
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

// The staging buffer of a writer that bypasses the page cache: `align`-
// aligned memory, written out whole with pwrite on an O_DIRECT descriptor of
// the temporary file. `base` (a multiple of `align`) is the file offset of
// buf[0]; the bytes before it are on the disk.
struct AtomicFileWriter::Direct {
  size_t stage = 0;  // bytes of buf
  int fd = -1;
  size_t align = 0;
  uint8_t* buf = nullptr;
  size_t used = 0;
  uint64_t base = 0;
  bool flushed_any = false;
  Direct() = default;
  Direct(const Direct&) = delete;
  Direct& operator=(const Direct&) = delete;
  ~Direct() {
    if (fd >= 0) ::close(fd);
    std::free(buf);
  }
};

namespace {

size_t round_up(size_t n, size_t align) { return (n + align - 1) / align * align; }

// Runs `io(at, k, offset + at)` (a pread or pwrite of k bytes at byte `at`
// of the caller's buffer) until all `n` bytes are moved, in pieces of at
// most 4 MiB; 0, or the errno of the failure (EIO for a call that moved
// nothing).
template <typename Io>
int move_all(size_t n, uint64_t offset, const Io& io) {
  for (size_t at = 0; at < n;) {
    const ssize_t k = io(at, std::min<size_t>(n - at, size_t{4} << 20), offset + at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k < 0 ? errno : EIO;
    at += static_cast<size_t>(k);
  }
  return 0;
}

int write_all(int fd, const uint8_t* p, size_t n, uint64_t offset) {
  return move_all(n, offset, [&](size_t at, size_t k, uint64_t o) {
    return ::pwrite(fd, p + at, k, static_cast<off_t>(o));
  });
}

int read_all(int fd, uint8_t* p, size_t n, uint64_t offset) {
  return move_all(n, offset, [&](size_t at, size_t k, uint64_t o) {
    return ::pread(fd, p + at, k, static_cast<off_t>(o));
  });
}

// The offset and memory alignment O_DIRECT needs on the file behind `fd`; 0
// where the file system does not do direct I/O.
size_t direct_io_alignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_offset_align == 0 || sx.stx_dio_mem_align == 0) return 0;
    return std::max<size_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 512});
  }
#endif
  (void)fd;
  return 4096;  // an older kernel: the common logical block; a refusal falls back
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(fs::path path, mode_t mode, FailFn fail, PageCache cache,
                                   size_t direct_stage_bytes)
    : path_(std::move(path)), mode_(mode), fail_(std::move(fail)) {
  temp_ = (path_.parent_path() / ("." + path_.filename().string() + ".XXXXXX")).string();
  fd_ = ::mkstemp(temp_.data());  // created 0600: a key is never readable by others
  if (fd_ < 0) failed("create a temporary file for", errno);
  created_ = true;
  if (cache == PageCache::kBypass) open_direct(direct_stage_bytes);
}

AtomicFileWriter::~AtomicFileWriter() {
  direct_.reset();
  if (fd_ >= 0) ::close(fd_);
  if (created_ && !committed_) ::unlink(temp_.c_str());
}

void AtomicFileWriter::open_direct(size_t stage) {
  const size_t align = direct_io_alignment(fd_);
  if (align == 0 || align > stage || stage % align != 0) return;
  auto d = std::make_unique<Direct>();
  d->fd = ::open(temp_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (d->fd < 0) return;  // the page cache it is
  void* mem = nullptr;
  if (::posix_memalign(&mem, std::max<size_t>(align, 4096), stage) != 0) return;
  d->buf = static_cast<uint8_t*>(mem);
  d->stage = stage;
  d->align = align;
  direct_ = std::move(d);
}

void AtomicFileWriter::failed(std::string_view action, int err) const {
  if (fail_) fail_(action, err);
  throw_file_error(action, path_, err);
}

void AtomicFileWriter::write_buffered(const uint8_t* p, size_t n, uint64_t offset) {
  // In pieces, so that a node writing a large file through the cache keeps
  // its heartbeats going between them (common/keep_alive.hpp).
  constexpr size_t kPiece = 8 << 20;
  while (n > 0) {
    const size_t k = std::min(n, kPiece);
    if (const int err = write_all(fd_, p, k, offset)) failed("write", err);
    p += k;
    offset += k;
    n -= k;
    KeepAlive::pulse();
  }
}

// Writes the staged bytes out (`last`: the file's tail, padded to the
// alignment with zeros; commit cuts the padding off again). A file system
// that refuses the very first direct write gets the rest through the cache.
void AtomicFileWriter::flush_stage(bool last) {
  Direct& d = *direct_;
  const size_t n = last ? round_up(d.used, d.align) : d.used;
  std::memset(d.buf + d.used, 0, n - d.used);
  const int err = write_all(d.fd, d.buf, n, d.base);
  if (err == EINVAL && !d.flushed_any) {
    // Every staged byte goes again, through the cache, from the start.
    const std::unique_ptr<Direct> refused = std::move(direct_);
    write_buffered(refused->buf, refused->used, refused->base);
    return;
  }
  if (err != 0) failed("write", err);
  d.flushed_any = true;
  d.base += n;
  d.used = 0;
  KeepAlive::pulse();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0 && direct_) {
    Direct& d = *direct_;
    const size_t k = std::min(n, d.stage - d.used);
    std::memcpy(d.buf + d.used, p, k);
    d.used += k;
    size_ += k;
    p += k;
    n -= k;
    if (d.used == d.stage) flush_stage(false);
  }
  if (n == 0) return;
  write_buffered(p, n, size_);
  size_ += n;
}

// Bytes already on the disk under O_DIRECT: their aligned blocks are read,
// patched and written back.
void AtomicFileWriter::patch_flushed(uint64_t offset, const uint8_t* p, size_t n) {
  const Direct& d = *direct_;
  const uint64_t from = offset / d.align * d.align;
  const size_t len = round_up(static_cast<size_t>(offset + n - from), d.align);
  void* mem = nullptr;
  if (::posix_memalign(&mem, std::max<size_t>(d.align, 4096), len) != 0) failed("write", ENOMEM);
  const std::unique_ptr<uint8_t, decltype(&std::free)> block(static_cast<uint8_t*>(mem),
                                                             &std::free);
  if (const int err = read_all(d.fd, block.get(), len, from)) failed("read back", err);
  std::memcpy(block.get() + (offset - from), p, n);
  if (const int err = write_all(d.fd, block.get(), len, from)) failed("write", err);
}

void AtomicFileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (offset > size_ || n > size_ - offset) failed("write", EINVAL);
  if (!direct_) {
    write_buffered(p, n, offset);
    return;
  }
  Direct& d = *direct_;
  uint64_t end = offset + n;
  if (end > d.base) {  // the staged part is patched where it waits
    const uint64_t from = std::max(offset, d.base);
    std::memcpy(d.buf + (from - d.base), p + (from - offset), static_cast<size_t>(end - from));
    end = from;
  }
  if (end > offset) patch_flushed(offset, p, static_cast<size_t>(end - offset));
}

void AtomicFileWriter::commit(bool require_durable_rename,
                              const std::function<void(std::string_view)>& on_step) {
  if (direct_) {
    flush_stage(/*last=*/true);
    if (direct_ && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) failed("write", errno);
    direct_.reset();
  }
  if (on_step) on_step("written");
  if (::fchmod(fd_, mode_) != 0) failed("set the mode of", errno);
  // Seconds for a file written through the cache on a slow disk: a node
  // keeps its heartbeats going meanwhile (common/keep_alive.hpp).
  const int fd_to_sync = fd_;
  const int err_sync = KeepAlive::during([fd_to_sync] {
    stall_point("file.sync");  // a slow disk's fsync, for liveness tests
    return ::fsync(fd_to_sync) == 0 ? 0 : errno;
  });
  if (err_sync != 0) failed("sync", err_sync);
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
