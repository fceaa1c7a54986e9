// Topology, NodeSpec, FederationSpec and OuterOptimizerSpec for Python:
// read-only views (copies) of a parsed and validated federation tree.
#include <pybind11/stl.h>

#include <optional>
#include <sstream>

#include "bindings.hpp"
#include "fedwan/error.hpp"
#include "typed_args.hpp"

namespace fedwan::python {
namespace {

std::optional<std::string> parent_or_none(const NodeSpec& n) {
  if (n.parent.empty()) return std::nullopt;
  return n.parent;
}

std::string node_repr(const NodeSpec& n) {
  std::ostringstream s;
  s << "NodeSpec(id='" << n.id << "', role='" << role_name(n.role) << "'";
  if (!n.parent.empty()) s << ", parent='" << n.parent << "'";
  if (!n.endpoint.empty()) s << ", endpoint='" << n.endpoint << "'";
  if (!n.standby_endpoint.empty()) s << ", standby_endpoint='" << n.standby_endpoint << "'";
  if (n.role == Role::kSite) s << ", weight=" << n.weight;
  s << ", index=" << n.index << ")";
  return s.str();
}

std::vector<std::string> ids_of(const Topology& t, const std::vector<uint32_t>& indices) {
  std::vector<std::string> out;
  out.reserve(indices.size());
  for (uint32_t i : indices) out.push_back(t.node(i).id);
  return out;
}

py::dict aggregation_dict(const AggregationSpec& a) {
  py::dict bound;
  bound["mode"] = a.norm_bound.mode;
  bound["factor"] = a.norm_bound.factor;
  bound["window"] = a.norm_bound.window;
  bound["bound"] = a.norm_bound.bound;
  bound["action"] = a.norm_bound.action;
  py::dict d;
  d["rule"] = a.rule;
  d["params"] = a.params;
  d["finite_check"] = a.finite_check;
  d["max_abs"] = a.max_abs;
  d["replay_window"] = a.replay_window;
  d["norm_bound"] = bound;
  return d;
}

py::dict privacy_dict(const FederationSpec& f) {
  const PrivacySpec& p = f.privacy;
  py::dict d;
  d["mode"] = p.mode;
  d["clip"] = p.clip;
  d["noise_multiplier"] = p.noise_multiplier;
  d["target_epsilon"] = p.target_epsilon;
  d["delta"] = p.delta;
  d["epsilon_budget"] = p.epsilon_budget;
  d["target_quantile"] = p.target_quantile;
  d["clip_learning_rate"] = p.clip_learning_rate;
  d["clip_count_budget"] = p.clip_count_budget;
  return d;
}

void bind_node_spec(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<NodeSpec>(m, "NodeSpec", "One node of a topology (read-only).")
      .def_readonly("id", &NodeSpec::id,
                    "Unique id of the node ([A-Za-z0-9._-], at most 64 characters); the "
                    "node_id that SiteCore, Site and Aggregator take.")
      .def_property_readonly(
          "role", [](const NodeSpec& n) { return std::string(role_name(n.role)); },
          "'root', 'region' or 'site'.")
      .def_property_readonly("parent", &parent_or_none, "Parent id; None for the root.")
      .def_readonly("endpoint", &NodeSpec::endpoint,
                    "Aggregators: the ZeroMQ endpoint children connect to ('' for sites).")
      .def_readonly("bind", &NodeSpec::bind, "Aggregators: endpoint to bind ('' = endpoint).")
      .def_readonly("weight", &NodeSpec::weight, "Sites: aggregation weight.")
      .def_readonly("index", &NodeSpec::index, "Position in the file; the wire sender id.")
      .def_readonly("parent_index", &NodeSpec::parent_index,
                    "Index of the parent node in Topology.nodes; 0 (meaningless) for the root.")
      .def_readonly("children", &NodeSpec::children, "Indices of the children, in file order.")
      .def_readonly("jurisdiction", &NodeSpec::jurisdiction,
                    "Aggregators: where it runs, for the residency policy ('' if unset).")
      .def_readonly("allowed_jurisdictions", &NodeSpec::allowed_jurisdictions,
                    "Sites: jurisdictions its delta may go to (empty: any).")
      .def_readonly("k_min", &NodeSpec::k_min,
                    "Regions: forward only aggregates of at least this many sites (0: policy "
                    "default).")
      .def_readonly("standby_endpoint", &NodeSpec::standby_endpoint,
                    "Root: the endpoint of its standby, which takes over when it dies ('' = "
                    "none).")
      .def_readonly("standby_bind", &NodeSpec::standby_bind,
                    "Root: endpoint the standby binds ('' without a standby; defaults to "
                    "standby_endpoint).")
      .def_readonly("tcp_congestion", &NodeSpec::tcp_congestion,
                    "TCP congestion control of what this node sends ('' = the federation's).")
      .def_readonly("socket_buffer_bytes", &NodeSpec::socket_buffer_bytes,
                    "Socket buffers of this node's TCP links (None = the federation's).")
      .def_readonly("streams", &NodeSpec::streams,
                    "TCP connections of this node's uplink: 0 = auto, else 1..16 (None = the "
                    "federation's).")
      .def_readonly("max_streams", &NodeSpec::max_streams,
                    "The most connections auto opens on this node's uplink (None = the "
                    "federation's).")
      .def_readonly("late_join", &NodeSpec::late_join,
                    "Sites: the federation does not wait for it at the start; it counts from "
                    "the round boundary after it comes.")
      .def_readonly("windows", &NodeSpec::windows,
                    "Sites: daily UTC participation windows 'HH:MM[:SS]-HH:MM[:SS]' (empty: "
                    "always).")
      .def_readonly("metrics", &NodeSpec::metrics,
                    "'host:port' where the node serves Prometheus metrics and its status ('' = "
                    "none).")
      .def_readonly("removed", &NodeSpec::removed,
                    "Sites: taken out of the running federation by a later topology version "
                    "(it keeps its place: its index is its wire id).")
      .def_readonly("devices", &NodeSpec::devices,
                    "Sites: the most devices it may train on and bill per round (None: as it "
                    "declares).")
      .def_property_readonly(
          "aggregation",
          [](const NodeSpec& n) -> std::optional<py::dict> {
            if (!n.aggregation) return std::nullopt;
            return aggregation_dict(*n.aggregation);
          },
          "Aggregators: their own aggregation settings in place of the federation's (a dict "
          "like FederationSpec.aggregation, the whole result); None: the federation's. "
          "Topology.aggregation(id) gives what applies.")
      .def("__repr__", &node_repr);
}

void bind_outer_optimizer_spec(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<OuterOptimizerSpec>(m, "OuterOptimizerSpec",
                                 "The root's outer optimizer; unset values mean its defaults.")
      .def_readonly("name", &OuterOptimizerSpec::name,
                    "'fedavg' (params -= lr * mean delta), 'diloco' (Nesterov momentum on the "
                    "pseudo-gradient) or 'fedadam'.")
      .def_readonly("params", &OuterOptimizerSpec::params,
                    "The hyper-parameters set in the topology, by name (a copy); one left out "
                    "takes the optimizer's default (docs/topology.md lists them).")
      .def_property_readonly(
          "lr", [](const OuterOptimizerSpec& o) { return o.param("lr"); },
          "Outer learning rate; None: the optimizer's default (fedavg 1.0, diloco 0.7, fedadam "
          "0.01).")
      .def_property_readonly(
          "momentum", [](const OuterOptimizerSpec& o) { return o.param("momentum"); },
          "diloco only: Nesterov momentum in [0, 1); None: 0.9.")
      .def_property_readonly(
          "beta1", [](const OuterOptimizerSpec& o) { return o.param("beta1"); },
          "fedadam only: first-moment decay in [0, 1); None: 0.9.")
      .def_property_readonly(
          "beta2", [](const OuterOptimizerSpec& o) { return o.param("beta2"); },
          "fedadam only: second-moment decay in [0, 1); None: 0.99.")
      .def_property_readonly(
          "eps", [](const OuterOptimizerSpec& o) { return o.param("eps"); },
          "fedadam only: the denominator's epsilon, > 0; None: 1e-3.")
      .def("__repr__",
           [](const OuterOptimizerSpec& o) { return "OuterOptimizerSpec(name='" + o.name + "')"; });
}

void bind_federation_spec(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<FederationSpec>(m, "FederationSpec", "Round settings of a topology (read-only).")
      .def_readonly("rounds", &FederationSpec::rounds,
                    "Number of rounds the federation runs (outer steps of the root).")
      .def_readonly("inner_steps", &FederationSpec::inner_steps, "H: local steps per round.")
      .def_readonly("codec", &FederationSpec::codec,
                    "Codec of every delta and model on the wire (one of fedwan.codec_names()).")
      .def_readonly("chunk_bytes", &FederationSpec::chunk_bytes,
                    "Size of one chunk of a delta or model, in fp32 bytes (4 KiB .. 4 MiB), "
                    "before encoding: the unit that is sent, aggregated and acknowledged.")
      .def_readonly("outer_optimizer", &FederationSpec::outer,
                    "The root's outer optimizer and its hyper-parameters (an "
                    "OuterOptimizerSpec).")
      .def_readonly("round_timeout_s", &FederationSpec::round_timeout_s,
                    "How long a node waits for one round, in seconds; the default of "
                    "SiteCore's and Aggregator's round_timeout_s.")
      .def_readonly("replica_every", &FederationSpec::replica_every,
                    "Every how many rounds a node with a checkpoint directory sends its checkpoint "
                    "to its parent (the root: to its standby); 0 = never.")
      .def_readonly("tcp_congestion", &FederationSpec::tcp_congestion,
                    "TCP congestion control every node sets on its TCP links (a kernel "
                    "algorithm name such as 'bbr' or 'cubic'), or 'system' for the host's "
                    "default; a node's own tcp_congestion overrides it.")
      .def_readonly("overlap_steps", &FederationSpec::overlap_steps,
                    "tau: a site merges the next model this many inner steps after it sent "
                    "its update (SiteCore.begin_sync()/finish_sync(), fedwan.Site.step()), "
                    "training meanwhile; 1..inner_steps, 0 = blocking rounds.")
      .def_readonly("socket_buffer_bytes", &FederationSpec::socket_buffer_bytes,
                    "Send and receive buffer of every TCP link's sockets in bytes; 0 = the "
                    "kernel's autotuning; a node's own socket_buffer_bytes overrides it.")
      .def_readonly("streams", &FederationSpec::streams,
                    "TCP connections per tree link: 0 = auto (the default: each link uses as "
                    "many as pay, up to max_streams), else 1..16, frames striped across them; "
                    "a node's own streams overrides it for its uplink.")
      .def_readonly("max_streams", &FederationSpec::max_streams,
                    "The most connections auto opens per link (1..64, default 32).")
      .def_property_readonly(
          "aggregation_rule", [](const FederationSpec& f) { return f.aggregation.rule; },
          "How every aggregator combines its children's chunks (federation.aggregation.rule; "
          "default 'weighted_mean').")
      .def_property_readonly(
          "aggregation", [](const FederationSpec& f) { return aggregation_dict(f.aggregation); },
          "What every aggregator checks on each child's copy of a chunk before its rule "
          "combines them (federation.aggregation, docs/security.md 'Robust aggregation'): a "
          "dict {rule, params, finite_check, max_abs, replay_window, norm_bound: {mode, factor, "
          "window, bound, action}}.")
      .def_property_readonly(
          "privacy", &privacy_dict,
          "Differential privacy at the site level (federation.privacy, docs/security.md "
          "'Differential privacy'): a dict {mode, clip, noise_multiplier, target_epsilon, delta, "
          "epsilon_budget}; mode 'off', 'central' or 'local'.")
      .def("__repr__", [](const FederationSpec& f) {
        return "FederationSpec(rounds=" + std::to_string(f.rounds) +
               ", inner_steps=" + std::to_string(f.inner_steps) +
               ", overlap_steps=" + std::to_string(f.overlap_steps) + ", codec='" + f.codec +
               "', chunk_bytes=" + std::to_string(f.chunk_bytes) + ", outer_optimizer='" +
               f.outer.name + "')";
      });
}

// Finding nodes and what applies to them: the subtree, its weight, an
// aggregator's aggregation settings.
void bind_topology_methods(py::class_<Topology>& topology) {
  using namespace pybind11::literals;
  topology
      .def(
          "node", [](const Topology& t, const std::string& id) { return t.node(id); }, "id"_a,
          "The node with this id; raises fedwan.ConfigError when absent.")
      .def(
          "aggregation",
          [](const Topology& t, const std::string& id) {
            return aggregation_dict(t.aggregation(t.node(id)));
          },
          "id"_a,
          "What aggregator `id` applies to its children's copies (its own aggregation settings, "
          "else the federation's): a dict like FederationSpec.aggregation. Raises ConfigError "
          "for an id not in the topology.")
      .def(
          "find",
          [](const Topology& t, const std::string& id) -> std::optional<NodeSpec> {
            const NodeSpec* n = t.find(id);
            if (n == nullptr) return std::nullopt;
            return *n;
          },
          "id"_a, "The node with this id (a copy), or None when there is none.")
      .def(
          "sites_under",
          [](const Topology& t, const std::string& id) {
            return ids_of(t, t.sites_under(t.node(id).index));
          },
          "id"_a,
          "Ids of the sites in the subtree under node `id` (itself if a site), in file "
          "order; raises fedwan.ConfigError for an unknown id.")
      .def(
          "weight_under",
          [](const Topology& t, const std::string& id) { return t.weight_under(t.node(id).index); },
          "id"_a,
          "Total weight of the sites under node `id` (its own weight if a site); raises "
          "fedwan.ConfigError for an unknown id.");
}

// A topology's identity (digest, version, history, signature), its
// residency policy and its YAML.
void bind_topology_identity(py::class_<Topology>& topology) {
  using namespace pybind11::literals;
  topology
      .def_property_readonly(
          "digest",
          [](const Topology& t) {
            return py::bytes(reinterpret_cast<const char*>(t.digest().data()), t.digest().size());
          },
          "SHA-256 of the canonical tree and settings (32 bytes).")
      .def(
          "k_min_for",
          [](const Topology& t, const std::string& id) { return t.k_min_for(t.node(id).index); },
          "id"_a,
          "Effective k_min of node `id`: the fewest sites an aggregate a region forwards "
          "must combine (its own k_min, else policy.k_min); 1 for the root and for sites.")
      .def(
          "residency_refusal",
          [](const Topology& t, const std::string& site, const std::string& aggregator) {
            return t.residency_refusal(site, aggregator);
          },
          "site"_a, "aggregator"_a,
          "Residency policy: None when site `site`'s delta may go to aggregator "
          "`aggregator` (its own parent, in a jurisdiction its allowed_jurisdictions "
          "admit), else the reason it may not. Unknown ids give a reason too; never raises.")
      .def_property_readonly("version", &Topology::version,
                             "Topology version: 1 for a federation's first; an operator changes "
                             "a running federation with later, admin-signed versions.")
      .def_property_readonly(
          "history",
          [](const Topology& t) {
            std::vector<std::string> out;
            for (const auto& d : t.history()) {
              std::string hex;
              for (uint8_t b : d)
                hex += "0123456789abcdef"[b >> 4], hex += "0123456789abcdef"[b & 15];
              out.push_back(hex);
            }
            return out;
          },
          "Hex digests of every earlier version, oldest first (empty for version 1).")
      .def_property_readonly(
          "signed", [](const Topology& t) { return t.signature().has_value(); },
          "Whether it carries an admin signature (checked by the aggregators that adopt it, "
          "and by `fedwan topology verify`).")
      .def("digest_hex", &Topology::digest_hex,
           "The digest as 64 lowercase hex characters; every node of a federation must "
           "show the same.")
      .def("to_yaml", &Topology::to_yaml,
           "Renders the topology back to YAML text; parsing it gives the same digest.")
      .def("__repr__", [](const Topology& t) {
        return "Topology(job='" + t.job() + "', nodes=" + std::to_string(t.nodes().size()) +
               ", rounds=" + std::to_string(t.federation().rounds) + ", codec='" +
               t.federation().codec + "', digest=" + t.digest_hex().substr(0, 12) + ")";
      });
}

}  // namespace

void bind_topology(py::module_& m) {
  using namespace pybind11::literals;

  bind_node_spec(m);
  bind_outer_optimizer_spec(m);
  bind_federation_spec(m);

  py::class_<Topology> topology(m, "Topology", R"(The federation tree and its round settings.

Build one with Topology.load(path) or Topology.parse(text); both validate the
whole file and raise fedwan.ConfigError naming the file, the node and the
problem. Every node of a federation must load the same topology (same digest).)");
  topology
      .def_static(
          "load", [](const PathArg& path) { return Topology::load(path_from(path.obj, "path")); },
          "path"_a,
          R"(Loads and validates a topology YAML file (a str or os.PathLike path).
Raises fedwan.ConfigError naming the file, the node and the problem, also when
the file cannot be read.)")
      .def_static("parse", &Topology::parse, "text"_a, "source"_a = "<string>",
                  R"(Parses and validates topology YAML text; `source` names it in errors.
Raises fedwan.ConfigError naming the source, the node and the problem.)")
      .def_property_readonly("job", &Topology::job,
                             "Name of the federation's job; every frame carries its hash "
                             "(job_id), and frames of another job are rejected.")
      .def_property_readonly("job_id", &Topology::job_id,
                             "First 8 bytes of SHA-256(job), little-endian (the wire job id).")
      .def_property_readonly(
          "federation", [](const Topology& t) { return t.federation(); },
          "The round settings (a copy).")
      .def_property_readonly(
          "rounds", [](const Topology& t) { return t.federation().rounds; },
          "federation.rounds: the number of rounds asked for.")
      .def_property_readonly("rounds_to_run", &Topology::rounds_to_run,
                             "The rounds the federation runs: federation.rounds, or fewer when "
                             "federation.privacy's epsilon_budget ends it sooner.")
      .def_property_readonly(
          "inner_steps", [](const Topology& t) { return t.federation().inner_steps; },
          "federation.inner_steps: H, local steps per round.")
      .def_property_readonly(
          "overlap_steps", [](const Topology& t) { return t.federation().overlap_steps; },
          "federation.overlap_steps: tau, inner steps a site trains on while its sync is in "
          "flight; 0 = blocking rounds.")
      .def_property_readonly(
          "codec", [](const Topology& t) { return t.federation().codec; },
          "federation.codec: the codec on the wire.")
      .def_property_readonly(
          "chunk_bytes", [](const Topology& t) { return t.federation().chunk_bytes; },
          "federation.chunk_bytes: fp32 bytes per chunk.")
      .def_property_readonly(
          "round_timeout_s", [](const Topology& t) { return t.federation().round_timeout_s; },
          "federation.round_timeout_s: how long a node waits for one round, in seconds.")
      .def_property_readonly(
          "outer_optimizer", [](const Topology& t) { return t.federation().outer.name; },
          "Name of the root's outer optimizer (fedavg, diloco, fedadam).")
      .def_property_readonly(
          "nodes", [](const Topology& t) { return t.nodes(); },
          "Every node, in file order (copies).")
      .def_property_readonly(
          "root", [](const Topology& t) { return t.root(); }, "The root node (a copy).")
      .def_property_readonly("has_standby", &Topology::has_standby,
                             "Whether the root has a standby (root.standby_endpoint is set).");
  bind_topology_methods(topology);
  bind_topology_identity(topology);
}

}  // namespace fedwan::python
