// What crosses the wire: a federation of real `fedwan` processes (root -> 1
// region -> 2 sites over loopback TCP) whose every child -> parent link runs
// through a recording TcpRelay. The region and sites start from another seed
// than the root, so the root must send the full fp32 values of its initial model down
// the tree: without encryption those bytes are certainly on the wire. With the
// default mutual TLS + AEAD links the capture holds none of the model's bytes;
// with --insecure-plaintext (the positive control, which proves the search
// would find them) it holds every window of the initial model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <unordered_set>

#include "fedwan/codec.hpp"
#include "harness/federation_fixture.hpp"
#include "harness/process.hpp"
#include "harness/tcp_relay.hpp"
#include "security/frame_protector.hpp"
#include "tensor/chunk_plan.hpp"
#include "wire/frame.hpp"

#ifdef FEDWAN_CLI_PATH

namespace fedwan::testing {
namespace {

constexpr size_t kParams = 20000;
// The root starts from synthetic::initial_model(--synthetic-size, --seed),
// as `fedwan aggregator` builds it (cli::initial_model). The region's and the
// sites' other seed gives their model another digest, so the root sends a
// full anchor.
constexpr uint64_t kRootSeed = 11;
constexpr uint64_t kSiteSeed = 12;

// A window of 8 or 16 bytes as a hashable key (an 8-byte one has hi = 0).
struct WindowKey {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const WindowKey& o) const { return lo == o.lo && hi == o.hi; }
};

struct WindowKeyHash {
  size_t operator()(const WindowKey& k) const {
    return std::hash<uint64_t>()(k.lo * 0x9E3779B97F4A7C15ull ^ k.hi);
  }
};

struct SearchResult {
  size_t hits = 0;      // capture offsets where some window starts
  size_t distinct = 0;  // different windows found
};

// Every `width`-byte window of a model's bytes that starts at an element,
// found by sliding over a capture once with hash look-ups.
class WindowIndex {
 public:
  WindowIndex(size_t width, const uint8_t* bytes, size_t size, size_t element_bytes)
      : width_(width) {
    for (size_t off = 0; off + width_ <= size; off += element_bytes) {
      windows_.insert(key(bytes + off));
    }
  }

  size_t size() const { return windows_.size(); }

  SearchResult search(const std::vector<uint8_t>& capture) const {
    SearchResult r;
    std::unordered_set<WindowKey, WindowKeyHash> found;
    for (size_t off = 0; off + width_ <= capture.size(); ++off) {
      const WindowKey k = key(capture.data() + off);
      if (windows_.count(k)) {
        r.hits += 1;
        found.insert(k);
      }
    }
    r.distinct = found.size();
    return r;
  }

 private:
  WindowKey key(const uint8_t* p) const {
    WindowKey k;
    std::memcpy(&k.lo, p, 8);
    if (width_ == 16) std::memcpy(&k.hi, p + 8, 8);
    return k;
  }

  size_t width_;
  std::unordered_set<WindowKey, WindowKeyHash> windows_;
};

WindowIndex fp32_windows(const std::vector<float>& model) {
  return WindowIndex(16, reinterpret_cast<const uint8_t*>(model.data()),
                     model.size() * sizeof(float), sizeof(float));
}

// The fp16 halves of `model` (no residual). Encoding it whole gives the same
// halves as encoding chunk by chunk, because the tests' chunk (4096 elements)
// is a whole number of the codec's scale blocks (2048).
std::vector<uint8_t> fp16_halves(const std::vector<float>& model) {
  const Codec& fp16 = codec_by_name("fp16");
  std::vector<uint8_t> encoded(fp16.encoded_size(model.size()));
  fp16.encode(model.data(), model.size(), nullptr, encoded.data());
  const size_t scales = encoded.size() - 2 * model.size();
  return std::vector<uint8_t>(encoded.begin() + static_cast<std::ptrdiff_t>(scales), encoded.end());
}

struct HeaderCounts {
  size_t magic = 0;   // "FWAN" anywhere
  size_t sealed = 0;  // of those, version-2 frame headers with the sealed flag
};

HeaderCounts count_headers(const std::vector<uint8_t>& capture) {
  HeaderCounts c;
  for (size_t off = 0; off + wire::kHeaderSize <= capture.size(); ++off) {
    uint32_t magic;
    std::memcpy(&magic, capture.data() + off, 4);
    if (magic != wire::kMagic) continue;
    c.magic += 1;
    if (capture[off + 4] == wire::kVersion && (capture[off + 7] & security::kFlagSealed)) {
      c.sealed += 1;
    }
  }
  return c;
}

struct CaptureRun {
  FederationSpec fed;
  std::vector<uint8_t> capture;  // every relay's streams, one after another
  size_t connections = 0;
  std::vector<float> global;  // the root's final model
};

// Runs root -> region -> 2 sites as processes, each aggregator behind a
// relay (it binds its real port; its topology endpoint is the relay's).
// Fails the test (fatally) when a node or a relay fails.
void run_federation(bool encrypted, CaptureRun* out) {
  TempDir dir;
  FederationSpec& fed = out->fed;
  fed.rounds = 3;
  fed.inner_steps = 3;
  fed.codec = "fp16";
  fed.chunk_bytes = 16384;
  fed.round_timeout_s = 60;
  std::vector<NodeSpec> nodes = make_tree(dir.path(), 1, 2, fed).nodes();

  std::map<std::string, std::unique_ptr<TcpRelay>> relays;
  std::vector<int> real_ports;
  for (const NodeSpec& n : nodes) {
    if (n.role != Role::kSite) real_ports.push_back(free_tcp_port());
  }
  size_t k = 0;
  for (NodeSpec& n : nodes) {
    if (n.role == Role::kSite) continue;
    const int real = real_ports[k++];
    auto relay = std::make_unique<TcpRelay>(real);
    // The relay's ephemeral port must not be one an aggregator will bind.
    while (std::find(real_ports.begin(), real_ports.end(), relay->port()) != real_ports.end()) {
      relay = std::make_unique<TcpRelay>(real);
    }
    n.bind = "tcp://127.0.0.1:" + std::to_string(real);
    n.endpoint = "tcp://127.0.0.1:" + std::to_string(relay->port());
    relays[n.id] = std::move(relay);
  }
  const Topology topo = Topology::build("capture-test", fed, nodes);
  const auto topo_path = dir.path() / "topology.yaml";
  std::ofstream(topo_path) << topo.to_yaml();

  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (const NodeSpec& n : topo.nodes()) {
    const bool site = n.role == Role::kSite;
    std::vector<std::string> args = {site ? "site" : "aggregator", "--topology", topo_path.string(),
                                     "--node", n.id};
    args.insert(args.end(),
                {"--trainer", "synthetic", "--synthetic-size", std::to_string(kParams)});
    // The region starts from the sites' model too, so the root's reaches it
    // in full as well (a region holding the root's would not be sent it).
    const bool root = n.role == Role::kRoot;
    args.insert(args.end(), {"--seed", std::to_string(root ? kRootSeed : kSiteSeed)});
    args.insert(args.end(), {"--join-timeout", "60"});
    if (encrypted) {
      args.insert(args.end(), {"--credentials", security_for(topo, n.id).credentials_dir});
    } else {
      args.push_back("--insecure-plaintext");
    }
    if (n.role == Role::kRoot) {
      args.insert(args.end(), {"--out", (dir.path() / "root.bin").string()});
    }
    logs.push_back((dir.path() / (n.id + ".log")).string());
    pids.push_back(spawn_process(FEDWAN_CLI_PATH, args, logs.back()));
  }
  const std::vector<int> codes = wait_processes(pids, std::chrono::seconds(120));
  for (auto& [id, relay] : relays) relay->stop();
  for (size_t i = 0; i < codes.size(); ++i) {
    ASSERT_EQ(codes[i], 0) << topo.nodes()[i].id << " log:\n" << read_text(logs[i]);
  }
  for (auto& [id, relay] : relays) {
    ASSERT_EQ(relay->failure(), "") << "relay in front of " << id;
    ASSERT_GE(relay->connections(), 1u) << "nothing connected through the relay of " << id;
    const std::vector<uint8_t> bytes = relay->capture();
    out->capture.insert(out->capture.end(), bytes.begin(), bytes.end());
    out->connections += relay->connections();
  }
  out->global = read_model(dir.path() / "root.bin");
  ASSERT_EQ(out->global.size(), kParams);
}

void report(const char* label, const char* key, size_t value) {
  ::testing::Test::RecordProperty(key, std::to_string(value));
  std::cout << "[capture:" << label << "] " << key << " = " << value << std::endl;
}

// Hits of each known model in a capture.
struct ModelHits {
  HeaderCounts headers;
  size_t windows_searched = 0;
  SearchResult initial_fp32;  // the root's initial model, fp32 windows
  SearchResult final_fp32;    // the root's final model, fp32 windows
  SearchResult initial_fp16;  // the initial model's fp16 halves, 8-byte windows
};

// Searches `run`'s capture for the three models and reports the figures
// (RecordProperty and stdout) under `label`.
ModelHits search_models(const CaptureRun& run, const char* label) {
  const std::vector<float> init = synthetic::initial_model(kParams, kRootSeed);
  const std::vector<uint8_t> init16 = fp16_halves(init);
  const WindowIndex init_fp32 = fp32_windows(init);
  const WindowIndex final_fp32 = fp32_windows(run.global);
  const WindowIndex init_fp16(8, init16.data(), init16.size(), 2);
  ModelHits h;
  h.headers = count_headers(run.capture);
  h.windows_searched = init_fp32.size() + final_fp32.size() + init_fp16.size();
  h.initial_fp32 = init_fp32.search(run.capture);
  h.final_fp32 = final_fp32.search(run.capture);
  h.initial_fp16 = init_fp16.search(run.capture);

  report(label, "capture_bytes", run.capture.size());
  report(label, "connections", run.connections);
  report(label, "frame_headers", h.headers.magic);
  report(label, "sealed_frame_headers", h.headers.sealed);
  report(label, "windows_searched", h.windows_searched);
  report(label, "initial_fp32_windows", init_fp32.size());
  report(label, "initial_fp32_hits", h.initial_fp32.hits);
  report(label, "initial_fp32_distinct", h.initial_fp32.distinct);
  report(label, "final_fp32_windows", final_fp32.size());
  report(label, "final_fp32_hits", h.final_fp32.hits);
  report(label, "initial_fp16_windows", init_fp16.size());
  report(label, "initial_fp16_hits", h.initial_fp16.hits);
  return h;
}

// The search itself, without a federation: every window of each kind of model
// is found once when the model's bytes sit at an odd offset inside other bytes.
TEST(Capture, DetectorFindsEveryWindowOfAModel) {
  const std::vector<float> model = synthetic::initial_model(kParams, kRootSeed);
  const std::vector<uint8_t> halves = fp16_halves(model);
  const auto* fp32 = reinterpret_cast<const uint8_t*>(model.data());
  std::vector<uint8_t> haystack;
  haystack.reserve(1001 + model.size() * sizeof(float) + 777 + halves.size() + 333);
  haystack.insert(haystack.end(), 1001, 0x5A);
  haystack.insert(haystack.end(), fp32, fp32 + model.size() * sizeof(float));
  haystack.insert(haystack.end(), 777, 0xA5);
  haystack.insert(haystack.end(), halves.begin(), halves.end());
  haystack.insert(haystack.end(), 333, 0x00);

  const WindowIndex w32 = fp32_windows(model);
  const WindowIndex w16(8, halves.data(), halves.size(), 2);
  EXPECT_EQ(w32.size(), kParams - 3);
  EXPECT_EQ(w16.size(), kParams - 3);
  const SearchResult r32 = w32.search(haystack);
  const SearchResult r16 = w16.search(haystack);
  EXPECT_EQ(r32.distinct, w32.size());
  EXPECT_EQ(r32.hits, w32.size());
  EXPECT_EQ(r16.distinct, w16.size());
  EXPECT_EQ(r16.hits, w16.size());
}

TEST(Capture, EncryptedLinksCarryNoModelBytes) {
  CaptureRun run;
  ASSERT_NO_FATAL_FAILURE(run_federation(true, &run));
  const ModelHits h = search_models(run, "encrypted");

  // The capture is real: it is bigger than the three full fp32 anchors that
  // had to cross (root -> region, region -> each site), so a fortiori than
  // the model in fp16, and its frame headers (authenticated, not encrypted)
  // are readable and say the frames are sealed.
  EXPECT_GT(run.capture.size(), codec_by_name("fp16").encoded_size(kParams));
  EXPECT_GT(run.capture.size(), 3 * kParams * sizeof(float));
  EXPECT_GT(h.headers.magic, 0u);
  EXPECT_GT(h.headers.sealed, 0u);
  EXPECT_GT(h.windows_searched, 3 * (kParams - 3) - 10);  // hardly any duplicate window
  // And none of the model's bytes are in it.
  EXPECT_EQ(h.initial_fp32.hits, 0u);
  EXPECT_EQ(h.final_fp32.hits, 0u);
  EXPECT_EQ(h.initial_fp16.hits, 0u);
}

TEST(Capture, PlaintextControlCarriesTheModel) {
  CaptureRun run;
  ASSERT_NO_FATAL_FAILURE(run_federation(false, &run));
  const ModelHits h = search_models(run, "plaintext");

  // Every window that lies inside one chunk crossed three times: the full
  // anchor root -> region, then region -> each site. Windows straddling two
  // chunks are split by the next frame's header.
  const tensor::ChunkPlan plan = tensor::ChunkPlan::from_bytes(kParams, run.fed.chunk_bytes);
  const size_t within_chunks = kParams - 3 * plan.count();
  EXPECT_EQ(h.headers.sealed, 0u);
  EXPECT_GE(h.initial_fp32.distinct, within_chunks);
  EXPECT_GE(h.initial_fp32.hits, 3 * within_chunks);
}

}  // namespace
}  // namespace fedwan::testing

#endif  // FEDWAN_CLI_PATH
