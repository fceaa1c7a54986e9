// The federation tree (root, regions, sites) and its round settings, loaded
// from a YAML file. Pure data: no sockets. Thread safe once built (const).
#pragma once

#include "fedwan/export.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fedwan/outer_optimizer.hpp"

namespace fedwan {

// `streams: auto`: a child's uplink uses as many TCP connections as pay.
inline constexpr uint64_t kStreamsAuto = 0;

enum class Role : uint8_t { kRoot = 0, kRegion = 1, kSite = 2 };
FEDWAN_API const char* role_name(Role role);

// The bound every aggregator puts on the L2 norm of each child's copy of a
// chunk (docs/security.md, "Robust aggregation"). A chunk is a fixed slice of
// the flat model, so a bound per chunk bounds the whole update.
struct FEDWAN_API NormBoundSpec {
  // "adaptive": `factor` x the median of the chunk's accepted norms over the
  // last `window` rounds (in the first round, the median of the round's own
  // copies); "absolute": `bound` on a whole update, shared out over the
  // chunks by their size; "off".
  std::string mode = "adaptive";
  double factor = 4;    // adaptive: > 1
  uint64_t window = 3;  // adaptive: rounds of history, 1..64
  double bound = 0;     // absolute: > 0
  // "refuse" a copy over the bound (its weight delivered, not counted), or
  // "clip" it to the bound.
  std::string action = "refuse";
};

// How an aggregator judges and combines its children's copies of a chunk
// (docs/topology.md, "Aggregation"): value checks and a norm bound on every
// copy, then a rule registered by name; the default rule is the weighted
// mean, streamed. In the digest where not the default.
struct FEDWAN_API AggregationSpec {
  std::string rule = "weighted_mean";
  // The rule's parameters by name (median: none; trimmed_mean: trim;
  // multi_krum: byzantine, select); a rule refuses others.
  std::map<std::string, double> params;
  // Refuse a copy with a NaN or an infinity.
  bool finite_check = true;
  // Refuse a copy with a value beyond +-max_abs (0: no such bound).
  double max_abs = 1e6;
  // Refuse a copy byte for byte identical to one the same child sent for
  // the same chunk in the last `replay_window` rounds (an all-zero copy
  // excepted): a replayed update. 0: no such check; at most 1024.
  uint64_t replay_window = 16;
  NormBoundSpec norm_bound;
};

// Every setting equal (params as maps).
FEDWAN_API bool same_aggregation(const AggregationSpec& a, const AggregationSpec& b);

struct FEDWAN_API NodeSpec {
  std::string id;  // unique, [A-Za-z0-9._-], at most 64 characters
  Role role = Role::kSite;
  std::string parent;              // empty for the root
  std::string endpoint;            // aggregators: ZeroMQ endpoint children connect to
  std::string bind;                // aggregators: endpoint to bind (defaults to endpoint)
  double weight = 1.0;             // sites: aggregation weight (> 0)
  uint32_t index = 0;              // position in the file; the node's wire sender id
  uint32_t parent_index = 0;       // meaningless for the root
  std::vector<uint32_t> children;  // indices, in file order
  // Residency policy (see docs/topology.md). Labels are 1..32 characters of
  // [A-Za-z0-9._-], compared exactly (case-sensitive).
  std::string jurisdiction;                        // root, region: where it runs; "" = none
  std::vector<std::string> allowed_jurisdictions;  // sites: where its delta may go; empty = any
  uint32_t k_min = 0;  // regions: fewest sites per aggregate sent up; 0 = PolicySpec::k_min
  // Root only (see docs/topology.md, "Standby root"): a second process that
  // runs with the root's identity, holds the root's replicated checkpoint
  // and takes over when the root dies; the root's children fail over to it.
  // Declared last so existing aggregate initialisers keep their meaning.
  std::string standby_endpoint;  // "" = no standby
  std::string standby_bind;      // what the standby binds (defaults to standby_endpoint)
  // TCP congestion control of what this node sends (its uplink and, for an
  // aggregator, its downlinks): overrides FederationSpec::tcp_congestion;
  // "" = the federation's.
  std::string tcp_congestion;
  // Socket buffers of this node's TCP links, in place of
  // FederationSpec::socket_buffer_bytes; unset = the federation's.
  std::optional<uint64_t> socket_buffer_bytes;
  // FederationSpec::streams for this node's uplink; unset = the federation's.
  // Refused on the root, which has no parent link.
  std::optional<uint64_t> streams;
  // FederationSpec::max_streams for this node's uplink; unset = the
  // federation's. Refused on the root.
  std::optional<uint64_t> max_streams;
  // Elastic membership (docs/operations.md, "Membership"), sites only: the
  // federation starts without waiting for a late_join site; it joins
  // whenever it comes and counts from the next round.
  bool late_join = false;
  // Participation windows, sites only: daily UTC windows "HH:MM[:SS]-HH:MM[:SS]"
  // in which the site trains (an end before the start wraps past midnight;
  // "00:00-24:00" is all day). Outside them it pauses at a round boundary,
  // is neither waited for nor counted in the quorum, and resumes with a
  // resync when a window opens. Empty: always.
  std::vector<std::string> windows;
  // Where the node serves its Prometheus metrics and status over HTTP
  // ("host:port", port 0 = any free port); "" = not served.
  std::string metrics;
  // Sites only: taken out of a running federation by a later topology
  // version (docs/operations.md, "Topology versions"). The node keeps its
  // place in the file (its index is its wire id) but is no longer a member:
  // its parent refuses it and counts no weight for it.
  bool removed = false;
  // Sites only: the most devices (GPUs, or CPU ranks) the site may train
  // on and bill per round; its cost records are checked against it
  // (`fedwan costs --topology`), and a site started with more refuses to
  // start. Unset: the site's own count, billed as declared.
  std::optional<uint64_t> devices;
  // Aggregators only: how this aggregator judges and combines its
  // children's copies, in place of federation.aggregation (per aggregator,
  // or per tier by setting it on each aggregator of the tier). In YAML the
  // keys given apply over federation.aggregation (a new `rule` starts with
  // no params); here it holds the whole result. Unset: the federation's.
  // Topology::aggregation(node) says which applies.
  std::optional<AggregationSpec> aggregation;
};

// Differential privacy at the site level: a site's whole data is the unit
// protected (docs/security.md, "Differential privacy"). In the digest where
// not the default.
struct FEDWAN_API PrivacySpec {
  // "off"; "central": the aggregator that receives a site's update clips it
  // to `clip` (L2, the whole update), and the root puts discrete Gaussian
  // noise of z x clip x the largest site weight on the weighted sum;
  // "local": each site clips its own update and puts noise of z x 2 clip on
  // it before it is encoded.
  std::string mode = "off";
  double clip = 0;  // > 0 when on
  // z: the noise's standard deviation over the sensitivity. 0: chosen so
  // that the federation's rounds spend `target_epsilon`.
  double noise_multiplier = 0;
  double target_epsilon = 0;
  double delta = 1e-5;  // (0, 1)
  // 0: none. Else the federation ends after the last round whose
  // cumulated epsilon stays within it (fewer than `rounds` if need be).
  double epsilon_budget = 0;
  // Adaptive clipping (central mode, every site under the root): 0, `clip`
  // is fixed. In (0, 1): `clip` is where the clip starts; after each round
  // the root moves it toward this quantile of the sites' update norms,
  // clip x exp(-clip_learning_rate x (unclipped share - target_quantile)),
  // from a noised count of the sites that were not clipped. The count
  // spends `clip_count_budget` of each round's privacy (the update's noise
  // grows to leave it room), so epsilon is what it would be with a fixed
  // clip.
  double target_quantile = 0;
  double clip_learning_rate = 0.2;  // (0, 10]
  double clip_count_budget = 0.1;   // (0, 1)
};

struct FEDWAN_API FederationSpec {
  uint64_t rounds = 10;
  uint64_t inner_steps = 50;  // H
  std::string codec = "fp16";
  uint64_t chunk_bytes = 1 << 20;  // fp32 bytes per chunk, 4 KiB .. 4 MiB
  OuterOptimizerSpec outer;
  double round_timeout_s = 600;  // how long a node waits for one round
  // Fault tolerance (docs/operations.md). A round closes once every live
  // child has delivered, or at `deadline_s` after it opened (0: no deadline),
  // and only if the delivered weight is at least `quorum` of the total.
  double quorum = 1.0;              // share of total weight, (0, 1]
  double deadline_s = 0;            // 0 = wait for every live child
  double heartbeat_s = 2;           // heartbeat period on every link, > 0
  double heartbeat_timeout_s = 10;  // silence after which a peer is lost, > heartbeat_s
  // Every how many rounds a node with a checkpoint directory sends its
  // checkpoint to its parent (the root: to its standby); 0 = never.
  uint64_t replica_every = 1;
  // TCP congestion control every node sets on its TCP links' sockets: a
  // kernel algorithm name (1..15 of [a-z0-9_], e.g. bbr, cubic, reno), or
  // "system" to leave the host's default alone. A name the host does not
  // allow or have is warned about and the host's default used instead.
  std::string tcp_congestion = "bbr";
  // Overlap (docs/architecture.md, "Overlap"): a site keeps training while
  // its update goes up and the next anchor comes down, and merges the anchor
  // this many inner steps after it sent its update (tau, 1..inner_steps),
  // keeping the progress it made meanwhile. 0 = blocking rounds.
  uint64_t overlap_steps = 0;
  // Send and receive buffer of every TCP link's sockets, in bytes: 0 = the
  // kernel's autotuning (net.ipv4.tcp_wmem / tcp_rmem); else 64 KiB .. 1 GiB,
  // fixed (autotuning off; the kernel caps it at net.core.wmem_max /
  // rmem_max). See docs/topology.md, "Socket buffers".
  uint64_t socket_buffer_bytes = 0;
  // TCP connections per tree link: kStreamsAuto (`auto`, the default): a
  // child uses as many as pay, measured as it sends, up to max_streams; or a
  // fixed 1..16, frames striped across them. A node's own `streams` and
  // `max_streams` override these for its uplink. See docs/topology.md,
  // "Several TCP connections per link".
  uint64_t streams = kStreamsAuto;
  // The most `auto` opens, 1..64: one CUBIC connection over a long link
  // with 0.1% loss carries a few Mbit/s, so a fast one needs dozens.
  uint64_t max_streams = 32;
  // Every aggregator's rule (in the digest when not the default).
  AggregationSpec aggregation;
  PrivacySpec privacy;
};

// An admin's signature of a topology version (top-level `signature:` key):
// the admin certificate (DER) and the ECDSA signature of the version's
// digest, both base64 as in the file. See docs/security.md, "Topology
// versions". Checked by security::topology_signature_problem.
struct FEDWAN_API TopologySignature {
  std::string cert;   // base64 DER
  std::string value;  // base64 DER
};

// Federation-wide residency settings (top-level `policy:` key).
struct FEDWAN_API PolicySpec {
  uint32_t k_min = 1;  // default k_min of regions that set none; >= 1
};

class FEDWAN_API Topology {
 public:
  // Parse and validate. Throws ConfigError whose message names the file (or
  // "<string>"), the node and the problem: duplicate id, unknown parent, cycle,
  // missing endpoint, more or fewer than one root, a site with children, an
  // aggregator without children, bad weight, unknown role or key, a residency
  // key on a role that cannot carry it, a site whose parent's jurisdiction its
  // allowed_jurisdictions exclude, a region with fewer sites than its k_min,
  // a standby key on a node other than the root, a standby_endpoint equal to
  // the root's endpoint, a standby_bind without a standby_endpoint, a
  // tcp_congestion that is not a congestion control name or "system", or
  // streams outside 1..16 or set on the root.
  static Topology parse(const std::string& yaml_text, const std::string& source = "<string>");
  static Topology load(const std::string& path);

  const std::string& job() const { return job_; }
  uint64_t job_id() const { return job_id_; }  // first 8 bytes of SHA-256(job), LE
  // Read-only: a topology is validated and digested once; change settings by
  // building a new one (Topology::build) so every check runs again.
  const FederationSpec& federation() const { return federation_; }
  const PolicySpec& policy() const { return policy_; }
  // The rounds the federation runs: federation.rounds, or fewer when
  // federation.privacy's epsilon_budget ends it sooner.
  uint64_t rounds_to_run() const;
  // What aggregator `node` applies to its children's copies: its own
  // `aggregation`, else federation.aggregation.
  const AggregationSpec& aggregation(const NodeSpec& node) const {
    return node.aggregation ? *node.aggregation : federation_.aggregation;
  }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  const NodeSpec& node(const std::string& id) const;  // throws ConfigError: not in topology
  const NodeSpec* find(const std::string& id) const;  // nullptr when absent
  const NodeSpec& node(uint32_t index) const { return nodes_.at(index); }
  const NodeSpec& root() const { return nodes_.at(root_index_); }
  // The TCP connections `child`'s uplink may open, and whether how many it
  // uses adapts to what pays (`streams: auto`). The root: one, fixed.
  struct UplinkStreams {
    uint64_t connections = 1;
    bool adaptive = false;
  };
  UplinkStreams uplink_streams(const NodeSpec& child) const;
  // Whether the root has a standby (root().standby_endpoint is set).
  bool has_standby() const { return !root().standby_endpoint.empty(); }
  // Sites in the subtree under `index` (the node itself if it is a site).
  std::vector<uint32_t> sites_under(uint32_t index) const;
  // Sum of site weights under `index`.
  double weight_under(uint32_t index) const;
  // Residency checks for the runtime (pure; see docs/topology.md).
  // Effective k_min of node `region_index`: the fewest sites an aggregate it
  // sends upward must combine (a region forwarding fewer, e.g. after
  // stragglers, would let a single site's delta leave). The region's own
  // k_min, else policy().k_min; 1 for the root (the final destination, it
  // sends nothing up) and for a site (its own delta is residency_refusal's
  // business). Throws std::out_of_range for an index outside the topology.
  uint32_t k_min_for(uint32_t region_index) const;
  // Why `site_id`'s delta may not go to `aggregator_id`, or nullopt when it
  // may: only to its own parent, and only if that aggregator's jurisdiction is
  // in the site's allowed_jurisdictions (when it has any). Unknown ids, a
  // sender that is not a site or a receiver that is not an aggregator give a
  // reason too; never throws.
  [[nodiscard]] std::optional<std::string> residency_refusal(
      const std::string& site_id, const std::string& aggregator_id) const;
  // SHA-256 over a canonical rendering of the tree (ids, roles, parents,
  // weights, endpoints, residency and standby fields), the federation
  // settings and the policy: every node of one federation must agree on it.
  // Residency and standby fields that are unset, and fault-tolerance and
  // replication settings left at their default, add nothing, so a topology
  // without them keeps the digest it had before they existed.
  const std::array<uint8_t, 32>& digest() const { return digest_; }
  std::string digest_hex() const;
  // Renders back to YAML (used by `fedwan demo` to write its topology).
  std::string to_yaml() const;

  // Versions (docs/operations.md, "Topology versions"). A federation starts
  // from version 1; an operator changes a running one with a later version
  // that lists the digests of every earlier one (history, oldest first) and
  // is signed by the federation's admin identity. Version and history are in
  // the digest (from version 2 on); the signature is not (it signs it).
  uint64_t version() const { return version_; }
  const std::vector<std::array<uint8_t, 32>>& history() const { return history_; }
  // Whether `digest` is this version's or an earlier one's: a peer or a
  // checkpoint of an earlier version of this federation.
  bool knows_digest(const std::array<uint8_t, 32>& digest) const;
  // The digest of version 1 of this federation (this topology's own when it
  // is version 1): what checkpoints record, so a node resumes its
  // checkpoint under any later version of the same federation.
  const std::array<uint8_t, 32>& lineage_digest() const {
    return history_.empty() ? digest_ : history_.front();
  }
  const std::optional<TopologySignature>& signature() const { return signature_; }
  // This topology as the version after `previous` (its version + 1, its
  // history + its digest), unsigned. Throws ConfigError when the job differs.
  Topology as_successor_of(const Topology& previous) const;
  // The same version with `signature` attached (the digest does not change).
  Topology with_signature(TopologySignature signature) const;

  // Builds a topology programmatically; validates like parse().
  static Topology build(std::string job, FederationSpec federation, std::vector<NodeSpec> nodes,
                        PolicySpec policy = {});

 private:
  void finalize(const std::string& source);  // validate, index, digest

  std::string job_;
  uint64_t job_id_ = 0;
  FederationSpec federation_;
  PolicySpec policy_;
  std::vector<NodeSpec> nodes_;
  uint32_t root_index_ = 0;
  std::array<uint8_t, 32> digest_{};
  uint64_t version_ = 1;
  std::vector<std::array<uint8_t, 32>> history_;
  std::optional<TopologySignature> signature_;
};

}  // namespace fedwan
