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
#include "aggregator/region_role.hpp"
#include "aggregator/root_role.hpp"
#include "aggregator/standby_role.hpp"
#include "checkpoint/replica_fetch.hpp"
#include "common/log.hpp"
#include "common/sha256.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "node/node_frames.hpp"
#include "security/frame_protector.hpp"

namespace fedwan {

Aggregator::Impl::Impl(AggregatorOptions options)
    : opt_(std::move(options)),
      topo_(opt_.topology),
      self_(topo_.node(opt_.node_id)),  // a copy: topo_ may move to a later version
      cfg_(topo_, self_, {opt_.window, opt_.round_timeout}),
      book_(self_.role == fedwan::Role::kRoot) {
  model_.limits = cfg_.limits;
  check_options();
  init_children();
  const std::string bind =
      opt_.standby ? (self_.standby_bind.empty() ? self_.standby_endpoint : self_.standby_bind)
                   : (self_.bind.empty() ? self_.endpoint : self_.bind);
  open_links(bind);
  role_ = make_role();
  costs_.recorder = costs::CostRecorder(opt_.costs_path, topo_.job(), self_.id,
                                        role_name(self_.role), security_->key());
  start_metrics();
  clock_.deadline_timer = timers_.make_timer();
  clock_.ticks = StallClock(cfg_.heartbeat);
  timers_.every(cfg_.heartbeat, [this] { on_heartbeat_timer(); });
  watch_.start_digest = topo_.digest();
  if (!opt_.topology_file.empty()) (void)file_changed();  // the version it started from
  if (!opt_.checkpoint_dir.empty()) {
    repl_.store = std::make_unique<checkpoint::ReplicaStore>(
        std::filesystem::path(opt_.checkpoint_dir) / "replicas", topo_.lineage_digest(), 2,
        security_->verifier(), topo_.job());
  }
  log().info("[agg:{}] {}{} serving {} children on {}", self_.id, role_name(self_.role),
             opt_.standby ? " (standby)" : "", down_.children.size(), bind);
}

void Aggregator::Impl::check_options() const {
  if (self_.role == fedwan::Role::kSite) {
    throw ConfigError("node '" + self_.id + "' is a site; run it with `fedwan site`");
  }
  const bool root = self_.role == fedwan::Role::kRoot;
  if (opt_.standby && (!root || self_.standby_endpoint.empty())) {
    throw ConfigError(
        "--standby: '" + self_.id + "' is " +
        (root ? "a root without standby_endpoint in the topology" : std::string("not the root")) +
        "; a standby runs as the root node of a topology that names its "
        "standby_endpoint");
  }
  if (opt_.standby && opt_.checkpoint_dir.empty()) {
    throw ConfigError("--standby needs --checkpoint-dir: the standby keeps the root's "
                      "checkpoints there");
  }
  if (root && opt_.initial_model.empty()) {
    throw ConfigError("root '" + self_.id + "' needs an initial model (flat fp32 parameters)");
  }
}

std::unique_ptr<Aggregator::Impl::Role> Aggregator::Impl::make_role() {
  // The one place the role is chosen (check_options() allowed the pair).
  if (self_.role != fedwan::Role::kRoot) return std::make_unique<RegionRole>(*this);
  if (opt_.standby) return std::make_unique<StandbyRole>(*this);
  return std::make_unique<RootRole>(*this);
}

Aggregator::Impl::~Impl() = default;

void Aggregator::Impl::init_children() {
  for (uint32_t idx : self_.children) add_child(idx, topo_.node(idx).late_join);
}

void Aggregator::Impl::add_child(uint32_t idx, bool late) {
  const NodeSpec& n = topo_.node(idx);
  Child c;
  c.index = idx;
  c.id = n.id;
  c.is_site = n.role == fedwan::Role::kSite;
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
  down_.link.open(std::make_unique<transport::ChildrenLink>(*transport_, bind, cfg_.link,
                                                            security_->children_factory(),
                                                            security_->children_admission()),
                  "agg:" + self_.id);
  // Its crypto threads hash and check each delta's payload where they
  // opened it.
  down_.link.link().inspect_opened(
      aggregator::delta_inspector(security_->auditing() || !opt_.record_updates_dir.empty()));
  const size_t threads = down_.link.link().crypto_threads();
  if (threads > 0) {
    log().info("[agg:{}] children's frames opened and sealed on {} crypto thread(s) beside the "
               "event loop (FEDWAN_CRYPTO_THREADS)",
               self_.id, threads);
  }
}

void Aggregator::Impl::recover() {
  // Its own checkpoint, else the copy kept above it: a region's parent
  // keeps one, the root's standby (when the root's own are corrupt).
  if (role_->recover(resume_from_checkpoint())) {
    log().info("[agg:{}] resumed from its checkpoint at round {}", self_.id, round_);
  }
}

// The chunks of the children's mean an aggregator of a large model keeps in
// memory while they wait for their last copies; beyond, they wait on disk.
// The root's is larger: its sites, paced to run at most the chunks it holds
// ahead of the slowest (aggregator_pacing.cpp), then seldom wait for an
// allowance. A region's memory bound has no room for more.
constexpr size_t kInflightBudget = size_t{4} << 20;
constexpr size_t kRootInflightBudget = size_t{12} << 20;

bool Aggregator::Impl::spills() const {
  return opt_.spill_from_bytes == 0 || model_.elements >= opt_.spill_from_bytes / sizeof(float);
}

void Aggregator::Impl::init_model_state(uint64_t total_elements) {
  model_.elements = total_elements;
  model_.limits = cfg_.limits_for_model(total_elements);
  model_.plan = cfg_.plan(total_elements);
  anchors_.store = aggregator::FrameStore(spills(), opt_.checkpoint_dir, "agg:" + self_.id);
  std::vector<uint32_t> ids;
  for (uint32_t idx : self_.children) ids.push_back(idx);
  acc_.emplace(*model_.plan, ids, cfg_.rule, cfg_.screen);
  // Eight buffers of the largest sealed chunk frame: the copies on their
  // way to the children and the frames read back for them. Buffers the
  // aggregator held at its peak anyway, kept between uses.
  const size_t frame = wire::kHeaderSize + cfg_.codec->encoded_size(model_.plan->chunk_elements()) +
                       security::kSealTrailer + 64;
  frames_pool_ = BytePool::shared().lease(8, 8 * frame);
  if (anchors_.store.on()) {
    // 0 ("always"): every chunk waiting for copies waits on disk.
    const size_t budget = opt_.spill_from_bytes == 0          ? 0
                          : self_.role == fedwan::Role::kRoot ? kRootInflightBudget
                                                              : kInflightBudget;
    acc_->park_beyond(budget, opt_.checkpoint_dir, "agg:" + self_.id);
    // Sites run ahead of the slowest by the chunks whose sums the budget
    // holds.
    const size_t chunk_bytes = size_t{model_.plan->chunk_elements()} * sizeof(float);
    pacer_ = aggregator::UplinkPacer(static_cast<uint32_t>(budget / chunk_bytes));
  }
  for (uint32_t idx : ids) clip_children_copies(idx);
}

}  // namespace fedwan
