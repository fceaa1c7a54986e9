// The deterministic synthetic workload (fedwan/synthetic.hpp) for tests and
// examples: reproducible bit for bit with the C++ sites and benchmarks.
#include "bindings.hpp"
#include "fedwan/synthetic.hpp"
#include "typed_args.hpp"

namespace fedwan::python {

void bind_synthetic(py::module_& m) {
  using namespace pybind11::literals;
  m.def(
      "synthetic_initial_model",
      [](size_t n, uint64_t seed) {
        const std::vector<float> p = synthetic::initial_model(n, seed);
        return copy_to_numpy(p.data(), p.size());
      },
      "n"_a, "seed"_a,
      R"(The synthetic workload's initial model: a new float32 array of n values in
[-0.1, 0.1), the same for the same seed as the C++ sites and benchmarks start from.)");
  m.def(
      "synthetic_local_steps",
      [](const Float32ArrayArg& params, uint32_t site_index, uint64_t steps, uint64_t seed,
         float lr) {
        py::array arr = float32_buffer(params.obj, "params", /*writable=*/true,
                                       /*non_empty=*/false);
        auto* p = static_cast<float*>(arr.mutable_data());
        const auto n = static_cast<size_t>(arr.size());
        py::gil_scoped_release nogil;
        synthetic::local_steps(p, n, site_index, steps, seed, lr);
      },
      "params"_a, "site_index"_a, "steps"_a, "seed"_a, py::arg_v("lr", 0.05f, "0.05"),
      R"(Runs `steps` local steps of site `site_index` (its node index in the topology)
on `params`, in place: p -= lr * (p - target), with the targets of
synthetic_targets(). `params` must be a C-contiguous, writeable float32 array
(else fedwan.ConfigError); the GIL is released while it runs.)");
  m.def(
      "synthetic_targets",
      [](uint32_t site_index, size_t n, uint64_t seed) {
        py::array_t<float> out(static_cast<py::ssize_t>(n));
        float* t = out.mutable_data();
        for (size_t k = 0; k < n; ++k) t[k] = synthetic::target(site_index, k, seed);
        return out;
      },
      "site_index"_a, "n"_a, "seed"_a,
      R"(The n target values (a new float32 array) that synthetic_local_steps moves
site `site_index` (its node index) towards; each site has its own.)");
}

}  // namespace fedwan::python
