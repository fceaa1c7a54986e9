// Topology, NodeSpec, FederationSpec and OuterOptimizerSpec for Python:
// read-only views (copies) of a parsed and validated federation tree.
#include <pybind11/stl.h>

#include <sstream>

#include "bindings.hpp"
#include "fedwan/error.hpp"

namespace fedwan::python {
namespace {

std::string fspath(const py::handle& path) {
  return py::str(py::module_::import("os").attr("fspath")(path)).cast<std::string>();
}

py::object parent_or_none(const NodeSpec& n) {
  if (n.parent.empty()) return py::none();
  return py::str(n.parent);
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

}  // namespace

void bind_topology(py::module_& m) {
  using namespace pybind11::literals;

  py::class_<NodeSpec>(m, "NodeSpec", "One node of a topology (read-only).")
      .def_readonly("id", &NodeSpec::id)
      .def_property_readonly(
          "role", [](const NodeSpec& n) { return std::string(role_name(n.role)); },
          "'root', 'region' or 'site'.")
      .def_property_readonly("parent", &parent_or_none, "Parent id; None for the root.")
      .def_readonly("endpoint", &NodeSpec::endpoint,
                    "Aggregators: the ZeroMQ endpoint children connect to ('' for sites).")
      .def_readonly("bind", &NodeSpec::bind, "Aggregators: endpoint to bind ('' = endpoint).")
      .def_readonly("weight", &NodeSpec::weight, "Sites: aggregation weight.")
      .def_readonly("index", &NodeSpec::index, "Position in the file; the wire sender id.")
      .def_readonly("parent_index", &NodeSpec::parent_index)
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
      .def("__repr__", &node_repr);

  py::class_<OuterOptimizerSpec>(m, "OuterOptimizerSpec",
                                 "The root's outer optimizer; unset values mean its defaults.")
      .def_readonly("name", &OuterOptimizerSpec::name)
      .def_readonly("lr", &OuterOptimizerSpec::lr)
      .def_readonly("momentum", &OuterOptimizerSpec::momentum)
      .def_readonly("beta1", &OuterOptimizerSpec::beta1)
      .def_readonly("beta2", &OuterOptimizerSpec::beta2)
      .def_readonly("eps", &OuterOptimizerSpec::eps)
      .def("__repr__", [](const OuterOptimizerSpec& o) {
        return "OuterOptimizerSpec(name='" + o.name + "')";
      });

  py::class_<FederationSpec>(m, "FederationSpec", "Round settings of a topology (read-only).")
      .def_readonly("rounds", &FederationSpec::rounds)
      .def_readonly("inner_steps", &FederationSpec::inner_steps, "H: local steps per round.")
      .def_readonly("codec", &FederationSpec::codec)
      .def_readonly("chunk_bytes", &FederationSpec::chunk_bytes)
      .def_readonly("outer_optimizer", &FederationSpec::outer)
      .def_readonly("round_timeout_s", &FederationSpec::round_timeout_s)
      .def_readonly("replica_every", &FederationSpec::replica_every,
                    "Every how many rounds a node with a checkpoint directory sends its checkpoint "
                    "to its parent (the root: to its standby); 0 = never.")
      .def("__repr__", [](const FederationSpec& f) {
        return "FederationSpec(rounds=" + std::to_string(f.rounds) +
               ", inner_steps=" + std::to_string(f.inner_steps) + ", codec='" + f.codec +
               "', chunk_bytes=" + std::to_string(f.chunk_bytes) + ", outer_optimizer='" +
               f.outer.name + "')";
      });

  py::class_<Topology>(m, "Topology", R"(The federation tree and its round settings.

Build one with Topology.load(path) or Topology.parse(text); both validate the
whole file and raise fedwan.ConfigError naming the file, the node and the
problem. Every node of a federation must load the same topology (same digest).)")
      .def_static(
          "load", [](const py::handle& path) { return Topology::load(fspath(path)); }, "path"_a,
          "Loads and validates a topology YAML file.")
      .def_static("parse", &Topology::parse, "text"_a, "source"_a = "<string>",
                  "Parses and validates topology YAML; `source` names it in errors.")
      .def_property_readonly("job", &Topology::job)
      .def_property_readonly("job_id", &Topology::job_id,
                             "First 8 bytes of SHA-256(job), little-endian (the wire job id).")
      .def_property_readonly(
          "federation", [](const Topology& t) { return t.federation(); },
          "The round settings (a copy).")
      .def_property_readonly(
          "rounds", [](const Topology& t) { return t.federation().rounds; })
      .def_property_readonly(
          "inner_steps", [](const Topology& t) { return t.federation().inner_steps; })
      .def_property_readonly(
          "codec", [](const Topology& t) { return t.federation().codec; })
      .def_property_readonly(
          "chunk_bytes", [](const Topology& t) { return t.federation().chunk_bytes; })
      .def_property_readonly(
          "round_timeout_s", [](const Topology& t) { return t.federation().round_timeout_s; })
      .def_property_readonly(
          "outer_optimizer", [](const Topology& t) { return t.federation().outer.name; },
          "Name of the root's outer optimizer (fedavg, diloco, fedadam).")
      .def_property_readonly(
          "nodes", [](const Topology& t) { return t.nodes(); },
          "Every node, in file order (copies).")
      .def_property_readonly(
          "root", [](const Topology& t) { return t.root(); }, "The root node (a copy).")
      .def_property_readonly("has_standby", &Topology::has_standby,
                             "Whether the root has a standby (root.standby_endpoint is set).")
      .def(
          "node", [](const Topology& t, const std::string& id) { return t.node(id); }, "id"_a,
          "The node with this id; raises fedwan.ConfigError when absent.")
      .def(
          "find",
          [](const Topology& t, const std::string& id) -> py::object {
            const NodeSpec* n = t.find(id);
            return n == nullptr ? py::none() : py::cast(*n);
          },
          "id"_a, "The node with this id, or None.")
      .def(
          "sites_under",
          [](const Topology& t, const std::string& id) {
            return ids_of(t, t.sites_under(t.node(id).index));
          },
          "id"_a, "Ids of the sites in the subtree under node `id` (itself if a site).")
      .def(
          "weight_under",
          [](const Topology& t, const std::string& id) { return t.weight_under(t.node(id).index); },
          "id"_a, "Total site weight under node `id`.")
      .def_property_readonly(
          "digest",
          [](const Topology& t) {
            return py::bytes(reinterpret_cast<const char*>(t.digest().data()), t.digest().size());
          },
          "SHA-256 of the canonical tree and settings (32 bytes).")
      .def(
          "k_min_for",
          [](const Topology& t, const std::string& id) { return t.k_min_for(t.node(id).index); },
          "id"_a, "Effective k_min of a region (its own, else policy.k_min); 1 for the root.")
      .def(
          "residency_refusal",
          [](const Topology& t, const std::string& site, const std::string& aggregator) {
            return t.residency_refusal(site, aggregator);
          },
          "site"_a, "aggregator"_a,
          "None when the site's delta may go to that aggregator, else the reason it may not.")
      .def("digest_hex", &Topology::digest_hex, "The digest as 64 hex characters.")
      .def("to_yaml", &Topology::to_yaml, "Renders back to YAML; parsing it gives the same digest.")
      .def("__repr__", [](const Topology& t) {
        return "Topology(job='" + t.job() + "', nodes=" + std::to_string(t.nodes().size()) +
               ", rounds=" + std::to_string(t.federation().rounds) + ", codec='" +
               t.federation().codec + "', digest=" + t.digest_hex().substr(0, 12) + ")";
      });
}

}  // namespace fedwan::python
