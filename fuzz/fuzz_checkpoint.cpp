// Fuzzes the checkpoint readers: read_checkpoint (what a node resumes from)
// and the streaming check a parent runs on a replica and a child on what a
// parent sends back (check_checkpoint_stream), both with a signer check
// against a fixed test CA (fuzz/keys/). Any file may be crafted by whoever
// can write a node's disk or holds its replica.
//
// Both must never crash or throw anything but their documented errors, and
// they must agree: a file read_checkpoint accepts as site-a's signed
// checkpoint passes the streaming check too.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/replica_store.hpp"
#include "fedwan/error.hpp"
#include "security/node_key.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: %s\n", what);
  std::abort();
}

// The topology digest of the seeds (fuzz/make_corpus.cpp).
std::array<uint8_t, 32> seed_digest() {
  std::array<uint8_t, 32> d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(0xc0 + i);
  return d;
}

fedwan::CheckpointSignerCheck site_a() {
  static const auto v = std::make_shared<const fedwan::security::SignatureVerifier>(
      std::string(FEDWAN_FUZZ_KEYS) + "/ca.pem");
  fedwan::CheckpointSignerCheck c;
  c.verifier = v;
  c.signer.node_id = "site-a";
  c.signer.job = "fuzz";
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The readers take a path: an in-memory file stands in for the disk.
  static const int fd = memfd_create("checkpoint", 0);
  if (fd < 0) fail("memfd_create");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    fail("cannot write the input");
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  bool read_ok = false;
  std::string node;
  std::array<uint8_t, 32> digest{};
  try {
    const fedwan::Checkpoint c = fedwan::read_checkpoint(path, site_a());
    read_ok = true;
    node = c.node_id;
    digest = c.topology_digest;
  } catch (const fedwan::CryptoError&) {
  } catch (const fedwan::TransportError&) {
  }
  std::vector<uint8_t> in_memory;
  bool whole_ok = false;
  try {
    const fedwan::Checkpoint c = fedwan::read_checkpoint(path);  // integrity only
    whole_ok = true;
    for (const fedwan::CheckpointSection& s : c.sections) {
      in_memory.insert(in_memory.end(), s.bytes.begin(), s.bytes.end());
    }
  } catch (const fedwan::CryptoError&) {
  } catch (const fedwan::TransportError&) {
  }
  // Every section but the empty left in the file: the same verdict, and the
  // same bytes when read back.
  try {
    const fedwan::Checkpoint c = fedwan::read_checkpoint(path, {}, {1});
    std::vector<uint8_t> on_disk;
    for (const fedwan::CheckpointSection& s : c.sections) {
      const std::vector<uint8_t> b = fedwan::section_bytes(s);
      on_disk.insert(on_disk.end(), b.begin(), b.end());
    }
    if (!whole_ok) fail("a file refused when read whole passed with its sections on disk");
    if (on_disk != in_memory) fail("a section read back from the file differs from the one read");
  } catch (const fedwan::CryptoError&) {
    if (whole_ok) fail("a file read whole was refused with its sections on disk");
  } catch (const fedwan::TransportError&) {
  }
  fedwan::checkpoint::CheckpointIdentity id;
  const std::optional<std::string> stream =
      fedwan::checkpoint::check_checkpoint_stream(path, "site-a", seed_digest(), &id, site_a());
  if (read_ok && node == "site-a" && digest == seed_digest() && stream) {
    std::fprintf(stderr, "stream check: %s\n", stream->c_str());
    fail("read_checkpoint accepted a signed checkpoint the streaming check refused");
  }
  if (!stream && (id.node_id != "site-a" || id.topology_digest != seed_digest())) {
    fail("the streaming check passed a file of another node or topology");
  }
  return 0;
}
