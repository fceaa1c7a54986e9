// Whole-file reads and crash-safe whole-file writes for the small files the
// library persists: credentials and CRLs (security/certs), checkpoints.
//
// Errors are ConfigError (a path the user chose is missing, unreadable or
// unwritable). An I/O failure reads
//   "cannot <action> <path>: <strerror>; check that the directory exists and
//    is writable by this user"
// Thread safety: the functions share no state. Writers racing on one path
// each replace the file whole; the last rename wins.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace fedwan {

// Throws the ConfigError above for errno value `err`, e.g.
// throw_file_error("list the bundles in", dir, errno).
[[noreturn]] void throw_file_error(std::string_view action, const std::filesystem::path& path,
                                   int err);

struct ReadFileOptions {
  // Names the file in messages: "cannot read <what> <path>: ...".
  std::string what = "file";
  // A longer file is refused without reading it all: ConfigError
  // "<what> <path> is larger than <max_bytes>; <too_large_hint>" (the limit
  // in MiB or KiB when it is a whole number of them). The default is no limit.
  size_t max_bytes = std::numeric_limits<size_t>::max();
  std::string too_large_hint;  // what the user should conclude; may be empty
};

// The whole content of `path`. Throws ConfigError when it cannot be opened
// (a missing file too), read, or is longer than options.max_bytes.
std::string read_file(const std::filesystem::path& path, const ReadFileOptions& options = {});

// As read_file, but nullopt when `path` does not exist (open fails with
// ENOENT, which includes a missing parent directory).
std::optional<std::string> read_file_if_exists(const std::filesystem::path& path,
                                               const ReadFileOptions& options = {});

// Replaces `path` with `bytes` so that a reader, or a restart after a crash
// or power cut, sees the old content or the new, never part of either: writes
// a temporary ".<name>.XXXXXX" in the same directory (created 0600, so a
// secret is never readable by others meanwhile), sets `mode` (the umask does
// not apply), fsyncs it, renames it over `path` and fsyncs the directory.
// On error the temporary file is removed and `path` is left as it was; the
// final directory fsync is best effort (a failure there loses nothing already
// written, so it is not reported). Blocks on the disk.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes, mode_t mode);

// Whether a streamed file's bytes go through the kernel's page cache.
// kBypass (checkpoints, replicas: written once, large, read again only on a
// restart) writes them with O_DIRECT from an aligned staging buffer: the
// kernel's copy into the cache and its dirty-page accounting, which cost
// more CPU than the rest of a checkpoint together, are skipped, and a
// checkpoint does not push the training's memory out of the cache. Where
// the file system refuses O_DIRECT (or its alignment is unusual), the
// writer falls back to kKeep without a word: the bytes are the same.
enum class PageCache { kKeep, kBypass };

// The streaming form of write_file_atomic, for files too large to build in
// memory first (checkpoints): write() pieces, then commit(). Destroying an
// uncommitted writer removes the temporary file and leaves `path` alone.
// Failures go to `fail(action, errno)`, which must throw; the default throws
// the ConfigError of throw_file_error. Not thread safe; blocks on the disk.
class AtomicFileWriter {
 public:
  using FailFn = std::function<void(std::string_view action, int err)>;
  // `direct_stage_bytes`: the staging buffer kBypass writes from (a
  // multiple of the file system's alignment, else the cache it is); a
  // writer of which several are open at once (a parent receiving its
  // children's replicas) takes a smaller one.
  static constexpr size_t kDirectStageBytes = size_t{1} << 20;
  AtomicFileWriter(std::filesystem::path path, mode_t mode, FailFn fail = {},
                   PageCache cache = PageCache::kKeep,
                   size_t direct_stage_bytes = kDirectStageBytes);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);
  // Overwrites bytes already written at `offset` (a header whose fields are
  // known only once what follows is written). Bytes not yet written: the
  // failure "write" with EINVAL.
  void write_at(uint64_t offset, const void* data, size_t n);
  // Whether the bytes are going around the page cache (PageCache::kBypass
  // asked for and the file system took it).
  bool bypassing_cache() const { return direct_ != nullptr; }
  // Sets the mode, fsyncs, renames over `path`, then fsyncs the directory.
  // With require_durable_rename a failure of that last fsync is reported
  // (as action "sync directory of"); otherwise it is best effort.
  // `on_step`, if given, is called with "written" (before the fsync),
  // "synced" (before the rename) and "renamed" (after it): crash points.
  void commit(bool require_durable_rename = false,
              const std::function<void(std::string_view step)>& on_step = {});

 private:
  struct Direct;
  [[noreturn]] void failed(std::string_view action, int err) const;
  void open_direct(size_t stage);
  void write_buffered(const uint8_t* p, size_t n, uint64_t offset);
  void flush_stage(bool last);
  void patch_flushed(uint64_t offset, const uint8_t* p, size_t n);

  std::filesystem::path path_;
  mode_t mode_;
  FailFn fail_;
  std::string temp_;
  int fd_ = -1;
  uint64_t size_ = 0;               // bytes written so far
  std::unique_ptr<Direct> direct_;  // set while bypassing the page cache
  bool created_ = false;
  bool committed_ = false;
};

// fsync(2) on directory `dir`, making the creation, rename or removal of an
// entry in it durable. Throws ConfigError "cannot sync directory <dir>: ...".
void fsync_directory(const std::filesystem::path& dir);

// Creates `dir` and any missing parents, then sets `dir` (not the parents) to
// mode 0700 whatever the umask, also when it already existed.
void make_private_directory(const std::filesystem::path& dir);

}  // namespace fedwan
