#include "checkpoint/checkpoint_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "checkpoint/checkpoint_format.hpp"
#include "common/errno_text.hpp"
#include "common/node_id.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan {

// An open checkpoint file, closed with its last user.
struct CheckpointFd {
  int fd = -1;
  explicit CheckpointFd(int f) : fd(f) {}
  CheckpointFd(const CheckpointFd&) = delete;
  CheckpointFd& operator=(const CheckpointFd&) = delete;
  ~CheckpointFd() {
    if (fd >= 0) ::close(fd);
  }
};

// A section read_checkpoint verified and left in its file.
struct StoredSection {
  std::shared_ptr<CheckpointFd> file;  // open while any of its sections lives
  std::filesystem::path path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::array<uint8_t, 32> digest{};
};

namespace {

namespace fs = std::filesystem;

using checkpoint_format::kDigestSize;
using checkpoint_format::kMagic;
using checkpoint_format::throw_io;
// magic + version + flags + round + topology digest + node id length.
constexpr size_t kFixedHeaderSize = 4 + 2 + 2 + 8 + kDigestSize + 2;
// Sections are read and hashed in pieces of this size, so hashing starts
// before the whole section is in memory and every read() stays modest.
constexpr size_t kIoChunk = size_t{4} << 20;

uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] void throw_corrupt(const fs::path& path, const std::string& what) {
  throw CryptoError("checkpoint " + path.string() + ": " + what);
}

// Sequential reads of a checkpoint whose size is known up front, so a
// truncated file is reported before any read past its end. Every byte read
// goes into the manifest hash until the manifest digest itself is reached.
class CheckpointReader {
 public:
  CheckpointReader(int fd, const fs::path& path, uint64_t size)
      : fd_(fd), path_(path), size_(size) {}

  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }

  // Fills out[0..n) or throws CryptoError naming `what` when the file ends.
  void read(void* out, size_t n, const char* what) {
    if (n > size_ - offset_) truncated(what);
    auto* p = static_cast<uint8_t*>(out);
    for (size_t done = 0; done < n;) {
      const ssize_t r = ::read(fd_, p + done, std::min(n - done, kIoChunk));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_io("read", path_, errno);
      if (r == 0) {  // the file shrank since fstat
        size_ = offset_ + done;
        truncated(what);
      }
      done += static_cast<size_t>(r);
    }
    offset_ += n;
    if (hashing_) manifest_.update(p, n);
  }

  uint64_t read_le(int n, const char* what) {
    uint8_t b[8];
    read(b, static_cast<size_t>(n), what);
    return get_le(b, n);
  }

  // The digest of everything read so far; later reads are not hashed.
  Sha256Digest finish_manifest() {
    hashing_ = false;
    return manifest_.finish();
  }

  [[noreturn]] void truncated(const char* what) const {
    throw_corrupt(path_, "truncated after " + std::to_string(size_) + " bytes (reading " + what +
                             "): the file is incomplete or corrupt");
  }

 private:
  int fd_;
  const fs::path& path_;
  uint64_t size_;
  uint64_t offset_ = 0;
  Sha256 manifest_;
  bool hashing_ = true;
};

struct ManifestEntry {
  uint64_t length = 0;
  Sha256Digest digest{};
};

struct Manifest {
  std::vector<ManifestEntry> entries;
  // Bytes the sections claim; kept at most the file size so it cannot wrap.
  uint64_t claimed = 0;
};

std::string read_string(CheckpointReader& r, size_t n, const char* what) {
  std::string s(n, '\0');
  r.read(s.data(), n, what);
  return s;
}

struct Format {
  uint16_t version = 0;
  bool is_signed = false;
};

// Magic, version and flags.
Format read_format(CheckpointReader& r, const fs::path& path) {
  uint8_t magic[4];
  r.read(magic, sizeof magic, "the magic");
  if (std::memcmp(magic, kMagic, sizeof magic) != 0) {
    throw_corrupt(path, "bad magic: not a fedwan checkpoint file");
  }
  const auto version = static_cast<uint16_t>(r.read_le(2, "the version"));
  if (version > kCheckpointVersion) {
    throw_corrupt(path, "format version " + std::to_string(version) + " is newer than version " +
                            std::to_string(kCheckpointVersion) +
                            ", the newest this build reads: upgrade fedwan to load it");
  }
  if (version == 0) {
    throw_corrupt(path, "unknown format version 0 (this build reads 1 to " +
                            std::to_string(kCheckpointVersion) + ")");
  }
  const uint64_t flags = r.read_le(2, "the flags");
  const uint64_t known_flags = version == 1 ? 0 : kCheckpointFlagSigned;
  if ((flags & ~known_flags) != 0) {
    throw_corrupt(path, "unknown flags " + std::to_string(flags) + ": the checkpoint is corrupt");
  }
  return {version, (flags & kCheckpointFlagSigned) != 0};
}

// Round, topology digest and node id, into `c`.
void read_identity(CheckpointReader& r, const fs::path& path, Checkpoint* c) {
  c->round = r.read_le(8, "the round");
  r.read(c->topology_digest.data(), c->topology_digest.size(), "the topology digest");
  const uint64_t id_len = r.read_le(2, "the node id length");
  if (id_len == 0 || id_len > kMaxNodeIdLength) {
    throw_corrupt(path, "node id length " + std::to_string(id_len) + " outside 1.." +
                            std::to_string(kMaxNodeIdLength) + ": the checkpoint is corrupt");
  }
  c->node_id = read_string(r, id_len, "the node id");
  if (!is_valid_node_id(c->node_id)) {
    throw_corrupt(path, "node id is not 1..64 characters of [A-Za-z0-9._-]: the checkpoint is "
                        "corrupt");
  }
}

// A signed file's certificate, DER, with its length checked first.
std::vector<uint8_t> read_signer_cert(CheckpointReader& r, const fs::path& path) {
  const uint64_t cert_len = r.read_le(2, "the certificate length");
  if (cert_len == 0 || cert_len > security::kMaxSignerCertBytes) {
    throw_corrupt(path, "signer certificate length " + std::to_string(cert_len) + " outside 1.." +
                            std::to_string(security::kMaxSignerCertBytes) +
                            ": the checkpoint is corrupt");
  }
  std::vector<uint8_t> cert(cert_len);
  r.read(cert.data(), cert.size(), "the signer certificate");
  return cert;
}

// The manifest: each section's name into `c`, its length and digest into
// the result.
Manifest read_manifest(CheckpointReader& r, const fs::path& path, Checkpoint* c) {
  const uint64_t count = r.read_le(4, "the section count");
  if (count > kMaxCheckpointSections) {
    throw_corrupt(path, "section count " + std::to_string(count) + " over the limit " +
                            std::to_string(kMaxCheckpointSections) + ": the checkpoint is corrupt");
  }
  Manifest m;
  m.entries.resize(count);
  c->sections.resize(count);
  std::set<std::string_view> seen;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t name_len = r.read_le(2, "a section name length");
    if (name_len == 0 || name_len > kMaxCheckpointSectionNameLength) {
      throw_corrupt(path, "section " + std::to_string(i) + " name length " +
                              std::to_string(name_len) + " outside 1.." +
                              std::to_string(kMaxCheckpointSectionNameLength) +
                              ": the checkpoint is corrupt");
    }
    std::string& name = c->sections[i].name;
    name = read_string(r, name_len, "a section name");
    if (!is_valid_checkpoint_section_name(name)) {
      throw_corrupt(path, "section " + std::to_string(i) +
                              " name is not [a-z0-9_.-]: the checkpoint is corrupt");
    }
    if (!seen.insert(name).second) {
      throw_corrupt(path, "section '" + name + "' appears twice: the checkpoint is corrupt");
    }
    ManifestEntry& e = m.entries[i];
    e.length = r.read_le(8, "a section length");
    r.read(e.digest.data(), kDigestSize, "a section digest");
    if (e.length > r.size() - m.claimed) {
      throw_corrupt(path, "truncated after " + std::to_string(r.size()) + " bytes: section '" +
                              name + "' claims " + std::to_string(e.length) +
                              " bytes, more than the file holds");
    }
    m.claimed += e.length;
  }
  return m;
}

// Every length is known once the manifest is read: the file must be exactly
// this long.
void check_exact_size(const CheckpointReader& r, const fs::path& path, uint64_t claimed,
                      size_t trailer, bool is_signed) {
  const uint64_t avail = r.size() - r.offset();
  if (avail < trailer || avail - trailer < claimed) {
    throw_corrupt(path, "truncated after " + std::to_string(r.size()) +
                            " bytes: the manifest needs " + std::to_string(claimed) +
                            " section bytes and a " + std::to_string(trailer) + "-byte digest" +
                            (is_signed ? " and signature" : "") + " after offset " +
                            std::to_string(r.offset()));
  }
  if (avail - trailer > claimed) {
    throw_corrupt(path, std::to_string(avail - trailer - claimed) +
                            " trailing bytes after the manifest digest: the checkpoint is corrupt");
  }
}

// Each section's bytes, checked against its manifest digest; those of
// options.leave_on_disk_from bytes or more are hashed through one working
// buffer and left in `file`.
void read_sections(CheckpointReader& r, const fs::path& path,
                   const std::vector<ManifestEntry>& entries,
                   const std::shared_ptr<CheckpointFd>& file, const CheckpointReadOptions& options,
                   Checkpoint* c) {
  Sha256 section_hash;
  std::vector<uint8_t> buffer;
  for (uint64_t i = 0; i < entries.size(); ++i) {
    CheckpointSection& s = c->sections[i];
    const uint64_t length = entries[i].length;
    const bool on_disk = length > 0 && length >= options.leave_on_disk_from;
    const uint64_t offset = r.offset();
    if (!on_disk) s.bytes.resize(length);
    if (on_disk) buffer.resize(static_cast<size_t>(std::min<uint64_t>(length, kIoChunk)));
    for (uint64_t done = 0; done < length;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(length - done, kIoChunk));
      uint8_t* into = on_disk ? buffer.data() : s.bytes.data() + done;
      r.read(into, n, "section bytes");
      section_hash.update(into, n);
      done += n;
    }
    if (section_hash.finish() != entries[i].digest) {
      throw_corrupt(path, "section '" + s.name + "' digest mismatch: the checkpoint is corrupt");
    }
    if (on_disk) {
      s.stored = std::make_shared<const StoredSection>(
          StoredSection{file, path, offset, length, entries[i].digest});
      s.stored_size = length;
    }
  }
}

// The manifest digest (`computed`), then a signed file's signature block
// over it.
void check_trailer(CheckpointReader& r, const fs::path& path, const Checkpoint& c,
                   const CheckpointSignerCheck& check, const std::vector<uint8_t>& cert,
                   bool is_signed, const Sha256Digest& computed) {
  Sha256Digest stored{};
  r.read(stored.data(), stored.size(), "the manifest digest");
  if (computed != stored) {
    throw_corrupt(path, "manifest digest mismatch: the checkpoint is corrupt");
  }
  if (is_signed) {
    uint8_t block[2 + kCheckpointSignatureSlot];
    r.read(block, sizeof block, "the signature");
    const size_t sig_len = get_le(block, 2);
    if (sig_len == 0 || sig_len > kCheckpointSignatureSlot ||
        std::any_of(block + 2 + sig_len, block + sizeof block, [](uint8_t b) { return b != 0; })) {
      throw_corrupt(path, "malformed signature block: the checkpoint is corrupt");
    }
    // A file of another node is the caller's to report (a misplaced
    // directory), not a forgery.
    if (check.verifier && c.node_id == check.signer.node_id) {
      const std::vector<uint8_t> sig(block + 2, block + 2 + sig_len);
      if (auto bad = check.verifier->verify(cert, kCheckpointDomain, stored.data(), stored.size(),
                                            sig, check.signer)) {
        throw_corrupt(path, "its signature does not verify: " + *bad +
                                "; it was altered or forged, and is not used");
      }
    }
  }
}

}  // namespace

void checkpoint_format::throw_io(std::string_view action, const fs::path& path, int err) {
  throw TransportError("cannot " + std::string(action) + " checkpoint " + path.string() + ": " +
                       errno_text(err));
}

bool is_valid_checkpoint_section_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxCheckpointSectionNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

const CheckpointSection* Checkpoint::find(std::string_view name) const {
  for (const CheckpointSection& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

Checkpoint read_checkpoint(const fs::path& path, const CheckpointSignerCheck& check,
                           const CheckpointReadOptions& options) {
  auto f = std::make_shared<CheckpointFd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f->fd < 0) throw_io("open", path, errno);
  struct stat st {};
  if (::fstat(f->fd, &st) != 0) throw_io("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw TransportError("cannot read checkpoint " + path.string() + ": not a regular file");
  }
  CheckpointReader r(f->fd, path, static_cast<uint64_t>(st.st_size));

  const Format format = read_format(r, path);
  const bool is_signed = format.is_signed;
  Checkpoint c;
  read_identity(r, path, &c);
  if (check.verifier && !is_signed && c.node_id == check.signer.node_id) {
    throw_corrupt(path, "it is not signed, and this node accepts only checkpoints signed by '" +
                            check.signer.node_id +
                            "' (it runs with credentials; an unsigned file was written without "
                            "them, by a fedwan before 0.5, or by someone else). Move it aside");
  }
  std::vector<uint8_t> cert;
  if (is_signed) cert = read_signer_cert(r, path);
  const size_t trailer = kDigestSize + (is_signed ? 2 + kCheckpointSignatureSlot : 0);

  const Manifest manifest = read_manifest(r, path, &c);
  // Version 3: the manifest digest ends with the manifest (it covers the
  // section digests); before, it covered the section bytes too.
  std::optional<Sha256Digest> header_digest;
  if (format.version >= 3) header_digest = r.finish_manifest();
  check_exact_size(r, path, manifest.claimed, trailer, is_signed);
  read_sections(r, path, manifest.entries, f, options, &c);
  const Sha256Digest computed = header_digest ? *header_digest : r.finish_manifest();
  check_trailer(r, path, c, check, cert, is_signed, computed);
  return c;
}

void CheckpointSection::throw_on_disk() const {
  throw std::logic_error("checkpoint section '" + name +
                         "' is on disk: read it with read_section or stream_section");
}

void stream_section(const CheckpointSection& s, const CheckpointSection::Sink& sink) {
  if (!s.on_disk()) {
    if (s.size() > 0) sink(s.data(), s.size());
    return;
  }
  const StoredSection& d = *s.stored;
  std::vector<uint8_t> buffer(static_cast<size_t>(std::min<uint64_t>(d.length, kIoChunk)));
  Sha256 hash;
  for (uint64_t done = 0; done < d.length;) {
    // A whole piece before the sink sees it, short reads or not.
    const size_t want = static_cast<size_t>(std::min<uint64_t>(d.length - done, kIoChunk));
    for (size_t got = 0; got < want;) {
      const ssize_t n = ::pread(d.file->fd, buffer.data() + got, want - got,
                                static_cast<off_t>(d.offset + done + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_io("read", d.path, errno);
      if (n == 0) {
        throw_corrupt(d.path, "section '" + s.name +
                                  "' ends early: the file was truncated after it was verified");
      }
      got += static_cast<size_t>(n);
    }
    hash.update(buffer.data(), want);
    sink(buffer.data(), want);
    done += want;
  }
  if (hash.finish() != d.digest) {
    throw_corrupt(d.path, "section '" + s.name +
                              "' changed on disk after it was verified: the checkpoint is not "
                              "used");
  }
}

void read_section(const CheckpointSection& s, uint8_t* out) {
  stream_section(s, [&out](const uint8_t* data, size_t n) {
    std::memcpy(out, data, n);
    out += n;
  });
}

std::vector<uint8_t> section_bytes(const CheckpointSection& s) {
  std::vector<uint8_t> out(s.size());
  if (!out.empty()) read_section(s, out.data());
  return out;
}

}  // namespace fedwan
