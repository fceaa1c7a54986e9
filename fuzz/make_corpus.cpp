// Writes the generated seed inputs of the fuzz targets:
//   fuzz_make_corpus DIR   ->  DIR/<target>/<seed name>
// Run by hand when a wire or file format changes (fuzz/README.md); the
// certificate and CRL seeds of fuzz_certs come from the openssl command line
// instead. Seeds are small valid inputs: the fuzzer mutates them into the
// invalid ones.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_file.hpp"
#include "checkpoint/replica_image.hpp"
#include "fedwan/codec.hpp"
#include "fuzz_keys.hpp"
#include "security/audit_log.hpp"
#include "security/frame_protector.hpp"
#include "security/node_key.hpp"
#include "wire/frame.hpp"

namespace {

namespace fs = std::filesystem;
using namespace fedwan;
using Bytes = std::vector<uint8_t>;

fs::path g_out;

void write_seed(const std::string& target, const std::string& name, const Bytes& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + (dir / name).string());
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = scale * (static_cast<float>(i % 13) - 6.0f) / 7.0f * ((i % 5 == 0) ? 100.0f : 1.0f);
  }
  return v;
}

Bytes encode_values(const Codec& codec, const std::vector<float>& values) {
  Bytes out(codec.encoded_size(values.size()));
  codec.encode(values.data(), values.size(), nullptr, out.data());
  return out;
}

wire::FrameHeader header(wire::MsgType type) {
  wire::FrameHeader h;
  h.type = type;
  h.job_id = 0x1122334455667788ull;
  h.round = 3;
  h.sender = 2;
  return h;
}

Bytes data_frame(wire::MsgType type, const Codec& codec, uint32_t index, uint32_t count,
                 uint64_t total, const std::vector<float>& values, double weight, uint8_t flags) {
  wire::FrameHeader h = header(type);
  h.codec = static_cast<uint8_t>(codec.id());
  h.flags = flags;
  h.chunk_index = index;
  h.chunk_count = count;
  h.element_count = static_cast<uint32_t>(values.size());
  h.total_elements = total;
  h.weight = weight;
  const Bytes payload = encode_values(codec, values);
  return wire::encode_frame(h, payload.data(), payload.size());
}

// A region's delta with excused weight: values and the trailer, or (no
// values, n elements) the trailer alone.
wire::FrameHeader delta_header(const Codec& codec, uint32_t index, uint32_t count, uint32_t n,
                               uint64_t total, double weight) {
  wire::FrameHeader h = header(wire::MsgType::kDelta);
  h.codec = static_cast<uint8_t>(codec.id());
  h.chunk_index = index;
  h.chunk_count = count;
  h.element_count = n;
  h.total_elements = total;
  h.weight = weight;
  return h;
}

Bytes excused_delta(const Codec& codec, uint32_t index, uint32_t count, uint64_t total,
                    const std::vector<float>& values, double weight, double excused) {
  const Bytes payload = encode_values(codec, values);
  const auto n = static_cast<uint32_t>(values.size());
  return wire::encode_delta_frame(delta_header(codec, index, count, n, total, weight),
                                  payload.data(), payload.size(), excused);
}

Bytes no_values_delta(const Codec& codec, uint32_t index, uint32_t count, uint64_t total,
                      uint32_t n, double excused) {
  return wire::encode_delta_frame(delta_header(codec, index, count, n, total, 0.0), nullptr, 0,
                                  excused);
}

Bytes control_frame(wire::MsgType type, const Bytes& payload, uint64_t total = 0, uint8_t flags = 0,
                    uint8_t codec = 0) {
  wire::FrameHeader h = header(type);
  h.total_elements = total;
  h.flags = flags;
  h.codec = codec;
  return wire::encode_frame(h, payload.data(), payload.size());
}

std::vector<std::pair<std::string, Bytes>> frames() {
  wire::HelloPayload hello;
  hello.node_id = "site-eu-1";
  for (size_t i = 0; i < 32; ++i) {
    hello.topology_digest[i] = static_cast<uint8_t>(i);
    hello.model_digest[i] = static_cast<uint8_t>(255 - i);
  }
  wire::TelemetryPayload telemetry{123456, 654321, 42};
  const std::string reason = "topology digest differs";
  const Codec& fp32 = codec_by_name("fp32");
  const Codec& fp16 = codec_by_name("fp16");
  const Codec& bf16 = codec_by_name("bf16");
  const Codec& int8 = codec_by_name("int8");
  // New seeds go last: sealed_seeds() picks frames by index.
  return {
      {"hello", control_frame(wire::MsgType::kHello, wire::encode_hello(hello), 1000)},
      {"welcome", control_frame(wire::MsgType::kWelcome, {}, 1000, wire::kFlagNoChange)},
      {"anchor_fp16", data_frame(wire::MsgType::kAnchor, fp16, 0, 2, 24, ramp(16, 1.0f), 0.0,
                                 wire::kFlagFullAnchor)},
      {"delta_fp32", data_frame(wire::MsgType::kDelta, fp32, 0, 1, 6, ramp(6, 0.5f), 2.5, 0)},
      {"delta_bf16", data_frame(wire::MsgType::kDelta, bf16, 2, 3, 30, ramp(10, 3.0f), 1.0, 0)},
      {"telemetry", control_frame(wire::MsgType::kTelemetry, wire::encode_telemetry(telemetry))},
      {"reject", control_frame(wire::MsgType::kReject, Bytes(reason.begin(), reason.end()))},
      {"done", control_frame(wire::MsgType::kDone, {})},
      {"handshake", control_frame(wire::MsgType::kHandshake, Bytes{0x16, 0x03, 0x03, 0, 2, 1, 0}, 0,
                                  0, static_cast<uint8_t>(security::AeadAlgorithm::kAes256Gcm))},
      {"handshake_no_session",
       control_frame(wire::MsgType::kHandshake, {}, 0, wire::kFlagNoSession)},
      {"delta_int8", data_frame(wire::MsgType::kDelta, int8, 1, 3, 900, ramp(300, 0.01f), 2.0, 0)},
      {"delta_fp16_excused", excused_delta(fp16, 1, 2, 40, ramp(20, 0.5f), 3.0, 1.5)},
      {"delta_fp32_no_values", no_values_delta(fp32, 0, 2, 12, 6, 4.0)},
      {"delta_fp32_unclipped",
       wire::encode_delta_frame(delta_header(fp32, 1, 2, 6, 12, 2.0),
                                encode_values(fp32, ramp(6, 0.25f)).data(),
                                encode_values(fp32, ramp(6, 0.25f)).size(), 1.0, 3)},
      {"anchor_fp32_clip",
       wire::with_clip(data_frame(wire::MsgType::kAnchor, fp32, 1, 2, 12, ramp(6, 0.1f), 0.0, 0),
                       0.75)},
      {"welcome_clip", wire::with_clip(control_frame(wire::MsgType::kWelcome, Bytes(32, 0x5a), 1000,
                                                     wire::kFlagKeepsReplicas),
                                       1.25)},
      {"heartbeat_pace",
       control_frame(wire::MsgType::kHeartbeat, wire::encode_pace({12, 4}), 0, wire::kFlagPace)},
      {"heartbeat_busy", control_frame(wire::MsgType::kHeartbeat, {}, 0, wire::kFlagBusy)},
  };
}

// fuzz_codec input: u64 LE n | f32 LE weight | payload.
Bytes codec_input(const Codec& codec, const std::vector<float>& values, float weight) {
  Bytes out(12);
  const uint64_t n = values.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, &weight, sizeof weight);
  const Bytes payload = encode_values(codec, values);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void codec_seeds() {
  const Codec& fp32 = codec_by_name("fp32");
  const Codec& fp16 = codec_by_name("fp16");
  const Codec& bf16 = codec_by_name("bf16");
  write_seed("fuzz_codec", "fp32_5", codec_input(fp32, ramp(5, 1.0f), 1.0f));
  write_seed("fuzz_codec", "fp16_7", codec_input(fp16, ramp(7, 1e-3f), 0.25f));
  // Two fp16 blocks, the second short: the per-block scales both matter.
  write_seed("fuzz_codec", "fp16_2100", codec_input(fp16, ramp(2100, 2.0f), 3.0f));
  write_seed("fuzz_codec", "bf16_9", codec_input(bf16, ramp(9, 1e30f), 1.0f));
  const Codec& int8 = codec_by_name("int8");
  write_seed("fuzz_codec", "int8_9", codec_input(int8, ramp(9, 1e-3f), 0.5f));
  // Three int8 blocks, the last short, of different magnitudes.
  std::vector<float> blocks = ramp(600, 1.0f);
  for (size_t i = 256; i < 512; ++i) blocks[i] *= 1e-6f;
  write_seed("fuzz_codec", "int8_600", codec_input(int8, blocks, 2.0f));
}

void frame_seeds() {
  for (const auto& [name, bytes] : frames()) write_seed("fuzz_frame", name, bytes);
}

// fuzz_sealed inputs: selector byte, then a sealed frame (kModeOpen) or
// tamper parameters and frame material (kModeTamper).
void sealed_seeds() {
  const auto all = frames();
  for (uint8_t cipher : {uint8_t{0}, fuzz::kCipherChaCha}) {
    const std::string suffix = cipher ? "_chacha" : "_aes";
    const auto algorithm = fuzz::fuzz_cipher(cipher);
    security::RekeyPolicy per_frame;
    per_frame.max_frames = 1;
    security::FrameSealer sealer(algorithm, fuzz::fuzz_key(), fuzz::fuzz_iv(), per_frame);
    // Frame 0 under epoch 0, frame 1 under epoch 1: the second makes a fresh
    // opener ratchet forward.
    for (size_t i = 0; i < 2; ++i) {
      Bytes sealed = all[i == 0 ? 3 : 0].second;
      sealer.seal(sealed);
      Bytes input{static_cast<uint8_t>(fuzz::kModeOpen | cipher)};
      input.insert(input.end(), sealed.begin(), sealed.end());
      write_seed("fuzz_sealed", "open_epoch" + std::to_string(i) + suffix, input);
    }
    // Tamper: 2 frames with a key each, flip a payload bit of the second.
    Bytes input{static_cast<uint8_t>(fuzz::kModeTamper | cipher), 0x05, 0x10, 0x02, 0, 0};
    const Bytes& frame = all[3].second;
    input.insert(input.end(), frame.begin(), frame.end());
    write_seed("fuzz_sealed", "tamper" + suffix, input);
  }
}

void audit_seeds() {
  const fs::path path = fs::temp_directory_path() / "fedwan-make-corpus-audit.jsonl";
  fs::remove(path);
  {
    security::AuditLog log(path.string(), "region-eu");
    log.append("peer_accepted", {{"peer", "site-eu-1"}, {"serial", "1A2B"}});
    log.append("update", {{"round", 3}, {"sites", {"site-eu-1", "site-eu-2"}}, {"weight", 2.5}});
    log.append("frame_rejected", {{"peer", "site-eu-2"},
                                  {"reason", "bad_tag"},
                                  {"nested", {{"a", {1, 2, {{"b", nullptr}}}}}}});
  }
  std::ifstream f(path, std::ios::binary);
  const Bytes text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  fs::remove(path);
  const security::AuditVerifyResult r =
      security::verify_audit_text(std::string(text.begin(), text.end()));
  if (!r.ok || r.entries != 3) throw std::runtime_error("generated audit log does not verify");
  write_seed("fuzz_audit", "three_entries.jsonl", text);

  // Signed heads (opened, a periodic one, closed) by the test key of
  // fuzz/keys, which fuzz_audit checks against its CA.
  const auto key = security::NodeKey::from_bundle(FEDWAN_FUZZ_KEYS);
  const fs::path signed_path = fs::temp_directory_path() / "fedwan-make-corpus-signed.jsonl";
  fs::remove(signed_path);
  {
    security::AuditOptions o;
    o.key = key;
    o.head_interval = std::chrono::seconds(0);
    security::AuditLog log(signed_path.string(), "site-a", o);
    log.append("update_sent", {{"round", 0}, {"chunks", 3}});
    log.append("checkpoint", {{"round", 1}});
  }
  std::ifstream sf(signed_path, std::ios::binary);
  const Bytes signed_text((std::istreambuf_iterator<char>(sf)), std::istreambuf_iterator<char>());
  fs::remove(signed_path);
  const security::SignatureVerifier ca(std::string(FEDWAN_FUZZ_KEYS) + "/ca.pem");
  security::AuditVerifyOptions vo;
  vo.ca = &ca;
  const security::AuditVerifyResult sr =
      security::verify_audit_text(std::string(signed_text.begin(), signed_text.end()), vo);
  if (!sr.ok || sr.verified_heads < 3) {
    throw std::runtime_error("generated signed audit log does not verify: " + sr.problem);
  }
  write_seed("fuzz_audit", "signed_heads.jsonl", signed_text);
}

// fuzz_checkpoint inputs: site-a's checkpoints under the seed topology
// digest, signed by the test key and unsigned.
void checkpoint_seeds() {
  Checkpoint c;
  c.round = 4;
  for (size_t i = 0; i < c.topology_digest.size(); ++i) {
    c.topology_digest[i] = static_cast<uint8_t>(0xc0 + i);
  }
  c.node_id = "site-a";
  const std::vector<float> params = ramp(64, 1.0f);
  CheckpointSection p{"params", Bytes(params.size() * 4)};
  std::memcpy(p.bytes.data(), params.data(), p.bytes.size());
  c.sections.push_back(p);
  c.sections.push_back({"meta", Bytes{'{', '}'}});
  const auto key = security::NodeKey::from_bundle(FEDWAN_FUZZ_KEYS);
  const fs::path path = fs::temp_directory_path() / "fedwan-make-corpus.fwck";
  for (const bool sign : {true, false}) {
    write_checkpoint(path, c, sign ? key.get() : nullptr);
    std::ifstream f(path, std::ios::binary);
    write_seed("fuzz_checkpoint", sign ? "signed.fwck" : "unsigned.fwck",
               Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
  }
  fs::remove(path);
}

// fuzz_replica_image inputs: images of a site's state against the
// target's base (64 floats, value i % 13 - 6), one section of each
// encoding, in the target's framing (fuzz_replica_image.cpp).
void replica_seeds() {
  std::vector<float> base(64), params(64), residual(64);
  for (size_t i = 0; i < base.size(); ++i) {
    base[i] = static_cast<float>(i % 13) - 6.0f;
    params[i] = base[i] + (i % 9 == 0 ? 0.01f : 0.0f);
    residual[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 7) - 3);
  }
  std::vector<uint16_t> held(64);
  for (size_t i = 0; i < held.size(); ++i) held[i] = static_cast<uint16_t>(0x3c00 + 37 * i);
  const auto bytes_of = [](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    return Bytes(b, b + n);
  };
  for (const bool with_params : {true, false}) {
    Checkpoint c;
    c.round = 3;
    c.node_id = "site-a";
    if (with_params) c.sections.push_back({"params", bytes_of(params.data(), 256)});
    c.sections.push_back({"anchor", bytes_of(base.data(), 256)});
    c.sections.push_back({"residual", bytes_of(residual.data(), 256)});
    c.sections.push_back({"residual.bf16", bytes_of(held.data(), 128)});
    c.sections.push_back({"optimizer", Bytes(300, 7)});
    const std::string meta = R"({"role":"site","data_position":9})";
    c.sections.push_back({"meta", Bytes(meta.begin(), meta.end())});
    Checkpoint image =
        checkpoint::make_replica_image(c, {"anchor", {"params"}, {"residual"}, {"residual.bf16"}});
    materialize(image);
    Bytes in;
    const CheckpointSection* m = image.find("meta");
    in.push_back(static_cast<uint8_t>(m->bytes.size() & 0xff));
    in.push_back(static_cast<uint8_t>(m->bytes.size() >> 8));
    in.insert(in.end(), m->bytes.begin(), m->bytes.end());
    for (const CheckpointSection& sec : image.sections) {
      if (sec.name == "meta") continue;
      in.push_back(static_cast<uint8_t>(sec.name.size()));
      in.insert(in.end(), sec.name.begin(), sec.name.end());
      for (int k = 0; k < 4; ++k) in.push_back(static_cast<uint8_t>(sec.bytes.size() >> (8 * k)));
      in.insert(in.end(), sec.bytes.begin(), sec.bytes.end());
    }
    write_seed("fuzz_replica_image", with_params ? "site_image" : "params_on_anchor", in);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus DIR   (writes DIR/<target>/<seed>)\n");
    return 2;
  }
  g_out = argv[1];
  try {
    frame_seeds();
    codec_seeds();
    sealed_seeds();
    audit_seeds();
    checkpoint_seeds();
    replica_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
