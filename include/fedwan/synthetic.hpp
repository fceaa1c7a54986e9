// A deterministic, torch-free training workload: every site minimises its own
// quadratic (params -> target_site) by plain gradient steps. Its sites
// disagree (non-IID), so the federated optimum is the weighted mean target.
// Used by tests, benchmarks and `fedwan site --trainer synthetic` to exercise
// the full protocol with results that can be reproduced bit for bit.
#pragma once

#include "fedwan/export.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fedwan::synthetic {

// The same model on every node for a seed.
FEDWAN_API std::vector<float> initial_model(size_t n, uint64_t seed);

// `steps` local steps of site `site` (its node index): p -= lr * (p - target).
FEDWAN_API void local_steps(float* params, size_t n, uint32_t site, uint64_t steps, uint64_t seed,
                            float lr = 0.05f);

// The site's target value for element k (a pure function of its arguments).
FEDWAN_API float target(uint32_t site, size_t k, uint64_t seed);

}  // namespace fedwan::synthetic
