// Differential privacy's accountant from Python (fedwan/privacy.hpp): what a
// number of rounds of Gaussian noise costs in (epsilon, delta), and the noise
// multiplier or rounds a budget allows.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "fedwan/privacy.hpp"

namespace fedwan::python {

void bind_privacy(py::module_& m) {
  py::class_<PrivacyAccountant>(m, "PrivacyAccountant",
                                R"(Renyi-DP accountant of fedwan's Gaussian noise.

Composes rounds of the Gaussian mechanism (noise standard deviation = noise
multiplier x the L2 sensitivity; every site in every round, no subsampling)
and converts to (epsilon, delta) at the orders Google's dp-accounting uses, so
both give the same epsilon for the same rounds. The root of a federation with
`privacy` settings keeps one (docs/security.md, "Differential privacy").)")
      .def(py::init<>())
      .def(py::init<std::vector<double>>(), py::arg("orders"),
           "An accountant over these Renyi orders (each > 1).")
      .def("compose_gaussian", &PrivacyAccountant::compose_gaussian, py::arg("noise_multiplier"),
           py::arg("count") = 1, "Adds `count` rounds with this noise multiplier (> 0).")
      .def(
          "epsilon", [](const PrivacyAccountant& a, double delta) { return a.loss(delta).epsilon; },
          py::arg("delta"), "The epsilon spent so far at this delta (0 < delta < 1).")
      .def(
          "loss",
          [](const PrivacyAccountant& a, double delta) {
            const PrivacyLoss l = a.loss(delta);
            py::dict d;
            d["epsilon"] = l.epsilon;
            d["delta"] = l.delta;
            d["order"] = l.order;
            return d;
          },
          py::arg("delta"), "{'epsilon', 'delta', 'order'}: the bound and the order it came from.")
      .def_property_readonly("rounds", &PrivacyAccountant::rounds, "The rounds composed so far.")
      .def_property_readonly("orders", &PrivacyAccountant::orders,
                             "The Renyi orders the bound is taken over.");
  m.def("privacy_epsilon", &gaussian_epsilon, py::arg("noise_multiplier"), py::arg("rounds"),
        py::arg("delta"), "Epsilon after `rounds` rounds of Gaussian noise with this multiplier.");
  m.def("noise_multiplier_for", &noise_multiplier_for, py::arg("epsilon"), py::arg("delta"),
        py::arg("rounds"),
        "The smallest noise multiplier whose `rounds` rounds spend at most `epsilon`.");
  m.def("privacy_rounds_within", &rounds_within, py::arg("epsilon"), py::arg("delta"),
        py::arg("noise_multiplier"),
        "How many rounds with this noise multiplier spend at most `epsilon` (0: not one).");
}

}  // namespace fedwan::python
