// The writer of a node's per-round cost records (docs/operations.md, "Cost
// accounting"): one JSON line per round appended to a file, read back by
// `fedwan costs` (cost_ledger.hpp). Schema kCostSchemaVersion
// (cost_schema.hpp):
//   {"v":2,"job":JOB,"node":ID,"role":"site"|"region"|"root","round":R,
//    "start":UTC,"end":UTC,                       ISO-8601, milliseconds, Z
//    "train_seconds":S,"devices":N,"device":"cpu"|"gpu","contributed":B,   sites
//    "links":{PEER:{"sent":BYTES,"received":BYTES},...},
//    "cert":BASE64 DER,"sig":BASE64}              with the node's key
// Bytes are what crossed the node's links between the end of the previous
// round and the end of this one, so the records of a node add up to every
// byte it sent and received (counted once, in one record). A record is
// written once its round ended (after the round's checkpoint): a node that
// crashes mid-round writes that round when it is done again.
//
// Signed: "sig" is the node's signature (security/node_key.hpp, domain
// kCostRecordDomain) over cost_record_signed_text() of the record, "cert"
// the certificate that verifies it. Whoever can write the file cannot
// forge a record of this node, nor one of another node. A node without a
// key (plaintext) writes unsigned records, which `fedwan costs` bills only
// when told to take records on their word.
//
// Thread safety: one thread per CostRecorder.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "costs/cost_schema.hpp"

namespace fedwan::security {
class NodeKey;
}  // namespace fedwan::security

namespace fedwan::costs {

class CostRecorder {
 public:
  CostRecorder() = default;  // records nothing
  // `path` empty: records nothing. `role` is "site", "region" or "root".
  // `key` null: unsigned records (a node without credentials).
  CostRecorder(std::string path, std::string job, std::string node, std::string role,
               std::shared_ptr<const security::NodeKey> key);

  bool enabled() const { return !path_.empty(); }
  void sent(const std::string& peer, uint64_t bytes) { links_[peer].sent += bytes; }
  void received(const std::string& peer, uint64_t bytes) { links_[peer].received += bytes; }
  // Sites: seconds of training (times devices: device-seconds) this round.
  void trained(double seconds) { train_seconds_ += seconds; }
  void set_devices(uint32_t devices, std::string kind) {
    devices_ = devices;
    device_ = std::move(kind);
  }

  // Appends the record of `round` (what was counted since the last one)
  // and starts the next. Never throws: a record that cannot be written (or
  // signed) is logged (warning, once per failure streak) and its counts are
  // kept for the next record, so totals still add up. The file is created
  // 0600: it is the node's own record, like its checkpoints.
  void round_ended(uint64_t round, bool contributed = false);

 private:
  std::string line(uint64_t round, bool contributed,
                   std::chrono::system_clock::time_point now) const;

  std::string path_, job_, node_, role_;
  std::shared_ptr<const security::NodeKey> key_;
  std::map<std::string, LinkBytes> links_;
  double train_seconds_ = 0;
  uint32_t devices_ = 1;
  std::string device_ = "cpu";
  std::chrono::system_clock::time_point start_;
  bool failing_ = false;
};

}  // namespace fedwan::costs
