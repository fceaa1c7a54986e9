// Aggregator, built and started: its options checked, its children's table,
// its links (the children's, and a region's uplink), the model's state once
// its size is known, and recovery at the first run() (a local checkpoint, or
// the replica its parent keeps).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aggregator/aggregator_impl.hpp"
#include "checkpoint/replica_fetch.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "node/node_frames.hpp"

namespace fedwan {

Aggregator::Impl::Impl(AggregatorOptions options)
    : opt_(std::move(options)),
      topo_(opt_.topology),
      self_(topo_.node(opt_.node_id)),  // a copy: topo_ may move to a later version
      is_root_(self_.role == Role::kRoot),
      cfg_(topo_, self_, {opt_.window, opt_.round_timeout}),
      limits_(cfg_.limits) {
  check_options();
  if (is_root_) init_root_model();
  init_children();
  const std::string bind =
      opt_.standby ? (self_.standby_bind.empty() ? self_.standby_endpoint : self_.standby_bind)
                   : (self_.bind.empty() ? self_.endpoint : self_.bind);
  open_links(bind);
  costs_.recorder = costs::CostRecorder(opt_.costs_path, topo_.job(), self_.id,
                                        role_name(self_.role), security_->key());
  start_metrics();
  deadline_timer_ = timers_.make_timer();
  timers_.every(cfg_.heartbeat, [this] { on_heartbeat_timer(); });
  watch_.start_digest = topo_.digest();
  if (!opt_.topology_file.empty()) (void)file_changed();  // the version it started from
  standby_.root_heard = Clock::now();
  if (!opt_.checkpoint_dir.empty()) {
    repl_.store = std::make_unique<checkpoint::ReplicaStore>(
        std::filesystem::path(opt_.checkpoint_dir) / "replicas", topo_.lineage_digest(), 2,
        security_->verifier(), topo_.job());
  }
  log().info("[agg:{}] {}{} serving {} children on {}", self_.id, role_name(self_.role),
             opt_.standby ? " (standby)" : "", down_.children.size(), bind);
}

void Aggregator::Impl::check_options() const {
  if (self_.role == Role::kSite) {
    throw ConfigError("node '" + self_.id + "' is a site; run it with `fedwan site`");
  }
  if (opt_.standby && (!is_root_ || self_.standby_endpoint.empty())) {
    throw ConfigError("--standby: '" + self_.id + "' is " +
                      (is_root_ ? "a root without standby_endpoint in the topology"
                                : std::string("not the root")) +
                      "; a standby runs as the root node of a topology that names its "
                      "standby_endpoint");
  }
  if (opt_.standby && opt_.checkpoint_dir.empty()) {
    throw ConfigError("--standby needs --checkpoint-dir: the standby keeps the root's "
                      "checkpoints there");
  }
  if (is_root_ && opt_.initial_model.empty()) {
    throw ConfigError("root '" + self_.id + "' needs an initial model (flat fp32 parameters)");
  }
}

void Aggregator::Impl::init_root_model() {
  root_.global = std::move(opt_.initial_model);
  init_model_state(root_.global.size());
  root_.held = root_.global;
  root_.model_digest = sha256(root_.global.data(), root_.global.size() * sizeof(float));
  root_.outer = make_outer_optimizer(cfg_.outer, root_.global.size());
}

void Aggregator::Impl::init_children() {
  for (uint32_t idx : self_.children) add_child(idx, topo_.node(idx).late_join);
}

void Aggregator::Impl::add_child(uint32_t idx, bool late) {
  const NodeSpec& n = topo_.node(idx);
  Child c;
  c.index = idx;
  c.id = n.id;
  c.is_site = n.role == Role::kSite;
  if (!c.is_site) down_.regions += 1;
  c.weight = topo_.weight_under(idx);  // 0 for a removed site
  // Until it reports its membership, a region counts with all its sites.
  c.member_weight = c.weight;
  c.member_sites = static_cast<uint32_t>(topo_.sites_under(idx).size());
  c.late = late;
  c.live = !c.late && !n.removed;  // a late_join site is not waited for until it comes
  if (n.removed) c.removed = true, c.away = Away::kLeft;
  down_.link.add(c.id);
  down_.children.push_back(std::move(c));
  repl_.serving.resize(down_.children.size());
}

void Aggregator::Impl::open_links(const std::string& bind) {
  security_ = std::make_unique<node::NodeSecurity>(opt_.security, topo_, self_);
  transport_ = transport::make_transport(bind);
  down_.link.open(std::make_unique<ChildrenLink>(*transport_, bind, cfg_.link,
                                                 security_->children_factory(),
                                                 security_->children_admission()),
                  "agg:" + self_.id);
  if (is_root_) return;
  session::ParentSession::Options so;
  so.link = cfg_.link;
  so.heartbeat = cfg_.heartbeat;
  so.heartbeat_timeout = cfg_.heartbeat_timeout;
  // A replaced session's queued frames are dropped: what matters is sent
  // again on the new one (hello, aggregates, checkpoint pieces).
  so.reconnect_linger_ms = 0;
  so.log_name = "agg:" + self_.id;
  up_.uplink = std::make_unique<session::Uplink>(topo_, self_, *transport_, *security_, so);
}

void Aggregator::Impl::recover() {
  bool resumed = resume_from_checkpoint();
  if (!resumed && !is_root_ && !opt_.checkpoint_dir.empty() &&
      checkpoint::fetch_replica(
          up_.uplink->link(),
          [this](const std::string& why) -> ParentLink& {
            reconnect_parent(why);
            return up_.uplink->link();
          },
          topo_, self_, cfg_, opt_.checkpoint_dir, 0, opt_.join_timeout, *security_,
          &stop_requested)) {
    // Its own checkpoints were gone or corrupt; the parent kept a copy.
    resumed = resume_from_checkpoint();
  }
  if (!resumed && root_.corrupt) {
    // Only corrupt checkpoints: the standby's copy, or no start at all
    // (starting over beside them would redo committed rounds).
    open_standby_link();
    if (checkpoint::fetch_replica(
            *standby_.link,
            [this](const std::string&) -> ParentLink& {
              open_standby_link();
              return *standby_.link;
            },
            topo_, self_, cfg_, opt_.checkpoint_dir, total_elements_, opt_.join_timeout, *security_,
            &stop_requested)) {
      resumed = resume_from_checkpoint();
    }
    if (!resumed) {
      throw CryptoError("root '" + self_.id +
                        "': its checkpoints are corrupt and its standby "
                        "keeps no copy; restore one (see docs/operations.md) or move the "
                        "directory away to start over");
    }
  }
  if (resumed) {
    log().info("[agg:{}] resumed from its checkpoint at round {}", self_.id, round_);
  } else if (opt_.standby) {
    standby_.passive = true;  // until the root dies
    log().info("[agg:{}] standby: keeping the root's checkpoints until it is needed", self_.id);
  }
  if (is_root_ && !opt_.standby && !self_.standby_endpoint.empty() && !standby_.link) {
    open_standby_link();
  }
}

void Aggregator::Impl::init_model_state(uint64_t total_elements) {
  total_elements_ = total_elements;
  limits_ = cfg_.limits_for_model(total_elements);
  plan_ = cfg_.plan(total_elements);
  std::vector<uint32_t> ids;
  for (uint32_t idx : self_.children) ids.push_back(idx);
  acc_.emplace(*plan_, ids, cfg_.rule);
}

}  // namespace fedwan
