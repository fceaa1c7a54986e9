// Whole-file reads and atomic replacement (common/atomic_file.hpp): what
// credential and checkpoint writers rely on.
#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fedwan/error.hpp"

#include "harness/error_message.hpp"

namespace fedwan {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("fedwan-atomic-file-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter++) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& p) const { return path_ / p; }

 private:
  fs::path path_;
};

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

using testing::config_error;

TEST(AtomicFile, RoundTripsBytesIncludingNulAndEmpty) {
  TempDir d;
  std::string bytes = "line 1\n";
  bytes += '\0';
  bytes += std::string(200000, 'x');  // more than one read() buffer
  bytes += "\xff\xfe end";
  write_file_atomic(d / "blob", bytes, 0644);
  EXPECT_EQ(read_file(d / "blob"), bytes);

  write_file_atomic(d / "empty", "", 0644);
  EXPECT_EQ(read_file(d / "empty"), "");
  EXPECT_EQ(fs::file_size(d / "empty"), 0u);
}

TEST(AtomicFile, SetsTheRequestedModeWhateverTheUmask) {
  TempDir d;
  const mode_t old_umask = ::umask(0077);
  write_file_atomic(d / "public", "p", 0644);
  ::umask(0);
  write_file_atomic(d / "secret", "s", 0600);
  ::umask(old_umask);
  EXPECT_EQ(mode_of(d / "public"), 0644u);
  EXPECT_EQ(mode_of(d / "secret"), 0600u);
}

TEST(AtomicFile, ReplacingAFileLeavesOnlyTheNewContentAndNoTemporaryFiles) {
  TempDir d;
  write_file_atomic(d / "crl.pem", "old content, longer than the new one", 0600);
  write_file_atomic(d / "crl.pem", "new", 0644);
  EXPECT_EQ(read_file(d / "crl.pem"), "new");
  EXPECT_EQ(mode_of(d / "crl.pem"), 0644u);  // the new mode, not the replaced file's
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"crl.pem"});
}

TEST(AtomicFile, WriteIntoAMissingDirectoryThrowsAndCreatesNothing) {
  TempDir d;
  const std::string msg =
      config_error([&] { write_file_atomic(d / "missing" / "key.pem", "k", 0600); });
  EXPECT_NE(msg.find("cannot create a temporary file for " + (d / "missing" / "key.pem").string()),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("check that the directory exists and is writable"), std::string::npos) << msg;
  EXPECT_TRUE(entries(d.path()).empty());
}

TEST(AtomicFile, WriteBelowARegularFileThrows) {
  TempDir d;
  write_file_atomic(d / "file", "f", 0644);
  EXPECT_NE(config_error([&] { write_file_atomic(d / "file" / "x", "x", 0644); }), "");
  EXPECT_EQ(read_file(d / "file"), "f");
}

TEST(AtomicFile, WriteIntoAReadOnlyDirectoryThrowsAndKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a 0500 directory regardless";
  TempDir d;
  const fs::path dir = d / "ro";
  fs::create_directory(dir);
  write_file_atomic(dir / "crl.pem", "old", 0644);
  ASSERT_EQ(::chmod(dir.c_str(), 0500), 0);
  const std::string msg = config_error([&] { write_file_atomic(dir / "crl.pem", "new", 0644); });
  ::chmod(dir.c_str(), 0700);
  EXPECT_NE(msg.find("cannot create a temporary file for"), std::string::npos) << msg;
  EXPECT_EQ(read_file(dir / "crl.pem"), "old");
  EXPECT_EQ(entries(dir), std::vector<std::string>{"crl.pem"});
}

TEST(AtomicFile, ReadingAMissingFile) {
  TempDir d;
  EXPECT_EQ(read_file_if_exists(d / "absent"), std::nullopt);
  EXPECT_EQ(read_file_if_exists(d / "no-dir" / "absent"), std::nullopt);
  ReadFileOptions o;
  o.what = "the checkpoint";
  const std::string msg = config_error([&] { read_file(d / "absent", o); });
  EXPECT_EQ(msg.rfind("cannot read the checkpoint " + (d / "absent").string() + ": ", 0), 0u)
      << msg;
  write_file_atomic(d / "present", "here", 0644);
  EXPECT_EQ(read_file_if_exists(d / "present"), std::optional<std::string>("here"));
}

TEST(AtomicFile, ReadRefusesAFileOverTheLimit) {
  TempDir d;
  write_file_atomic(d / "big", std::string(3 * 1024 + 1, 'b'), 0644);
  ReadFileOptions o;
  o.what = "the record";
  o.max_bytes = 3 * 1024;
  o.too_large_hint = "it is not a record";
  EXPECT_EQ(config_error([&] { read_file(d / "big", o); }),
            "the record " + (d / "big").string() + " is larger than 3 KiB; it is not a record");
  o.max_bytes += 1;
  EXPECT_EQ(read_file(d / "big", o).size(), 3u * 1024 + 1);  // exactly at the limit is fine
}

TEST(AtomicFile, MakePrivateDirectoryCreatesParentsAndForces0700) {
  TempDir d;
  const mode_t old_umask = ::umask(0);
  make_private_directory(d / "a" / "b");
  ::umask(old_umask);
  EXPECT_EQ(mode_of(d / "a" / "b"), 0700u);
  ASSERT_EQ(::chmod((d / "a" / "b").c_str(), 0755), 0);
  make_private_directory(d / "a" / "b");  // an existing directory is tightened too
  EXPECT_EQ(mode_of(d / "a" / "b"), 0700u);
  write_file_atomic(d / "plain", "", 0644);
  EXPECT_NE(config_error([&] { make_private_directory(d / "plain"); }), "");
}

TEST(AtomicFile, FsyncDirectory) {
  TempDir d;
  EXPECT_NO_THROW(fsync_directory(d.path()));
  const std::string msg = config_error([&] { fsync_directory(d / "missing"); });
  EXPECT_EQ(msg.rfind("cannot sync directory " + (d / "missing").string() + ": ", 0), 0u) << msg;
}

// Random bytes, the same for a given seed.
std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

// Streams `body` in uneven pieces, patches `patches` (offset, bytes) with
// write_at, commits; returns what reached the disk.
std::string stream_and_patch(const fs::path& path, const std::string& body,
                             const std::vector<std::pair<uint64_t, std::string>>& patches,
                             PageCache cache, bool* bypassed,
                             size_t stage = AtomicFileWriter::kDirectStageBytes) {
  AtomicFileWriter w(path, 0600, {}, cache, stage);
  *bypassed = w.bypassing_cache();
  size_t at = 0;
  for (size_t piece = 1; at < body.size(); piece = piece * 3 + 7) {
    const size_t n = std::min(piece % (size_t{3} << 20), body.size() - at);
    w.write(body.data() + at, n);
    at += n;
  }
  for (const auto& [offset, bytes] : patches) w.write_at(offset, bytes.data(), bytes.size());
  w.commit();
  return read_file(path);
}

TEST(AtomicFile, StreamedBytesAreTheSameThroughTheCacheAndAroundIt) {
  TempDir d;
  constexpr size_t kMiB = size_t{1} << 20;
  // Around the alignment, and around several lengths of the (1 MiB) staging buffer.
  for (const size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097},
                            4 * kMiB - 1, 4 * kMiB, 4 * kMiB + 1, 9 * kMiB + 123}) {
    const std::string body = random_bytes(size, static_cast<uint32_t>(size));
    std::vector<std::pair<uint64_t, std::string>> patches;
    if (size >= 100) patches.emplace_back(0, random_bytes(100, 1));  // a header
    if (size > 4 * kMiB + 60) patches.emplace_back(4 * kMiB - 60, random_bytes(120, 2));  // across
    if (size > 9 * kMiB) patches.emplace_back(9 * kMiB + 3, random_bytes(120, 3));        // staged
    if (size > 0) patches.emplace_back(size - 1, "z");  // the last byte
    std::string want = body;
    for (const auto& [offset, bytes] : patches) want.replace(offset, bytes.size(), bytes);
    bool bypassed = true;
    EXPECT_EQ(stream_and_patch(d / "kept", body, patches, PageCache::kKeep, &bypassed), want)
        << size;
    EXPECT_FALSE(bypassed);
    EXPECT_EQ(stream_and_patch(d / "direct", body, patches, PageCache::kBypass, &bypassed), want)
        << size;
    EXPECT_EQ(fs::file_size(d / "direct"), size);
    EXPECT_EQ(mode_of(d / "direct"), 0600u);
    // A smaller staging buffer (a parent's replica transfers), and one the
    // file system's alignment cannot divide (written through the cache).
    for (const size_t stage : {size_t{256} << 10, size_t{4096}, size_t{1000}}) {
      EXPECT_EQ(stream_and_patch(d / "staged", body, patches, PageCache::kBypass, &bypassed, stage),
                want)
          << size << " " << stage;
      if (stage == 1000) EXPECT_FALSE(bypassed);
    }
  }
  EXPECT_EQ(entries(d.path()), (std::vector<std::string>{"direct", "kept", "staged"}));
}

TEST(AtomicFile, AroundTheCacheWhereTheFileSystemAllowsIt) {
  TempDir d;
  const int probe = ::open((d / "probe").c_str(), O_CREAT | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  const bool direct_io = probe >= 0;
  if (probe >= 0) ::close(probe);
  AtomicFileWriter w(d / "f", 0600, {}, PageCache::kBypass);
  EXPECT_EQ(w.bypassing_cache(), direct_io);
}

TEST(AtomicFile, PatchingBytesNotYetWrittenFailsInBothModes) {
  TempDir d;
  for (const PageCache cache : {PageCache::kKeep, PageCache::kBypass}) {
    {
      AtomicFileWriter w(d / "f", 0600, {}, cache);
      w.write("abcdef", 6);
      const std::string msg = config_error([&] { w.write_at(4, "xyz", 3); });
      EXPECT_NE(msg.find("cannot write " + (d / "f").string()), std::string::npos) << msg;
      EXPECT_NO_THROW(w.write_at(3, "xyz", 3));
    }  // destroyed uncommitted: nothing left behind
    EXPECT_FALSE(fs::exists(d / "f"));
    EXPECT_EQ(entries(d.path()), std::vector<std::string>{});
  }
}

}  // namespace
}  // namespace fedwan
