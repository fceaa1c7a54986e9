// Fuzzes reading a replica image back (checkpoint/replica_image.hpp): its
// replica meta, each section decoded into a buffer of the size the meta
// declares (expand_replica_section, what a restoring node does) and the
// whole expansion, against a fixed base of kBase floats. An image is signed
// by the node that made it, so only that node could craft one; the decoder
// still must never write past the buffer it is given, crash, or throw
// anything but CryptoError.
//
// Input (replica_seeds in make_corpus.cpp writes real images so):
//   u16 LE meta length, the meta's bytes (JSON), then sections, each
//   u8 name length (1..64), the name, u32 LE length, the bytes (cut to
//   what is left).
// Each image is also written as a file and read back with its
// sections left there: the same verdict and the same bytes, section by
// section.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/replica_image.hpp"
#include "fedwan/error.hpp"

namespace {

using fedwan::Checkpoint;
using fedwan::CheckpointSection;

constexpr size_t kBase = 64;
constexpr uint64_t kMaxOut = uint64_t{16} << 20;  // buffers larger than this are not tried

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_replica_image: %s\n", what);
  std::abort();
}

const float* base() {
  static const std::vector<float> b = [] {
    std::vector<float> v(kBase);
    for (size_t i = 0; i < kBase; ++i) v[i] = static_cast<float>(i % 13) - 6.0f;
    return v;
  }();
  return b.data();
}

std::optional<Checkpoint> parse(const uint8_t* data, size_t size) {
  size_t at = 0;
  const auto take = [&](size_t n) -> const uint8_t* {
    if (size - at < n) return nullptr;
    const uint8_t* p = data + at;
    at += n;
    return p;
  };
  const uint8_t* ml = take(2);
  if (ml == nullptr) return std::nullopt;
  const uint8_t* meta = take(std::min<size_t>(ml[0] | (ml[1] << 8), size - at));
  Checkpoint c;
  c.round = 3;
  c.node_id = "site-a";
  c.sections.push_back({"meta", std::vector<uint8_t>(meta, data + at)});
  while (at < size && c.sections.size() < 16) {
    const uint8_t* nl = take(1);
    const uint8_t* name = nl == nullptr ? nullptr : take(nl[0]);
    const uint8_t* len = name == nullptr ? nullptr : take(4);
    if (len == nullptr) break;
    CheckpointSection s;
    s.name.assign(reinterpret_cast<const char*>(name), nl[0]);
    if (!fedwan::is_valid_checkpoint_section_name(s.name) || c.find(s.name) != nullptr) break;
    const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t{len[3]} << 24);
    const uint8_t* bytes = data + at;
    take(std::min<size_t>(n, size - at));
    s.bytes.assign(bytes, data + at);
    c.sections.push_back(std::move(s));
  }
  return c;
}

// Section `name` decoded into a buffer of exactly its declared size, with a
// guard past its end; nullopt when refused.
std::optional<std::vector<uint8_t>> decode(const Checkpoint& image, const std::string& name,
                                           uint64_t bytes) {
  std::vector<uint8_t> out(bytes + 64, 0xA5);
  try {
    fedwan::checkpoint::expand_replica_section(image, name, base(), kBase, out.data(), bytes);
  } catch (const fedwan::CryptoError&) {
    return std::nullopt;
  }
  for (size_t i = bytes; i < out.size(); ++i) {
    if (out[i] != 0xA5) fail("a decode wrote past the buffer it was given");
  }
  out.resize(bytes);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::optional<Checkpoint> image = parse(data, size);
  if (!image) return 0;
  std::vector<std::string> names;
  try {
    (void)fedwan::checkpoint::is_replica_image(*image);
    (void)fedwan::checkpoint::replica_base_sha256(*image);
  } catch (const fedwan::CryptoError&) {
  }
  try {
    names = fedwan::checkpoint::replica_section_names(*image);
  } catch (const fedwan::CryptoError&) {
    return 0;  // no replica meta to read sections by
  }
  // The same image as a file, its sections left there (write_checkpoint
  // renames into place: a file in memory where there is one).
  static const std::filesystem::path path = [] {
    const std::filesystem::path shm = "/dev/shm";
    std::error_code ec;
    const std::filesystem::path dir =
        std::filesystem::is_directory(shm, ec) ? shm : std::filesystem::temp_directory_path();
    return dir / ("fedwan-fuzz-replica-" + std::to_string(::getpid()) + ".fwck");
  }();
  static const struct Remove {
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } remove_at_exit;
  fedwan::write_checkpoint(path, *image);
  const Checkpoint on_disk = fedwan::read_checkpoint(path, {}, {1});
  uint64_t total = 0;
  for (const std::string& name : names) {
    const std::optional<uint64_t> bytes = fedwan::checkpoint::replica_section_size(*image, name);
    if (!bytes) fail("a listed section has no size");
    total += *bytes;
    if (*bytes > kMaxOut) continue;
    const auto in_memory = decode(*image, name, *bytes);
    const auto from_file = decode(on_disk, name, *bytes);
    if (in_memory.has_value() != from_file.has_value()) {
      fail("a section decodes in memory but not from its file, or the other way");
    }
    if (in_memory && *in_memory != *from_file) {
      fail("a section decodes to other bytes from its file");
    }
    // A buffer of another size is refused before it is touched.
    std::vector<uint8_t> small(*bytes == 0 ? 1 : static_cast<size_t>(*bytes - 1), 0x3C);
    try {
      fedwan::checkpoint::expand_replica_section(*image, name, base(), kBase, small.data(),
                                                 *bytes == 0 ? 1 : *bytes - 1);
      fail("a buffer of the wrong size was accepted");
    } catch (const fedwan::CryptoError&) {
    }
    if (std::any_of(small.begin(), small.end(), [](uint8_t b) { return b != 0x3C; })) {
      fail("a refused decode wrote to the buffer");
    }
  }
  if (total <= kMaxOut) {
    try {
      (void)fedwan::checkpoint::expand_replica_image(*image, base(), kBase);
    } catch (const fedwan::CryptoError&) {
    }
  }
  return 0;
}
