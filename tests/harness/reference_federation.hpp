// An in-process reference of the whole federation: the same codecs, the same
// accumulation and the same outer optimizer, applied in a fixed order with no
// sockets. With at most two children per aggregator the arrival order cannot
// change a float sum, so a real federation must match it bit for bit.
#pragma once

#include <functional>
#include <vector>

#include "aggregation/round_accumulator.hpp"
#include "fedwan/codec.hpp"
#include "fedwan/outer_optimizer.hpp"
#include "fedwan/synthetic.hpp"
#include "fedwan/topology.hpp"
#include "tensor/chunk_plan.hpp"

namespace fedwan::testing {

struct ReferenceResult {
  std::vector<float> global;  // the root's global model after the last round
  std::vector<float> held;    // the model every site holds at the end
};

// One chunk-by-chunk stream sent up a link: payload per chunk plus weight.
struct Upstream {
  std::vector<std::vector<uint8_t>> chunks;
  double weight = 0;
};

// Local training of a site: (site index, round, params in/out).
using LocalTraining = std::function<void(uint32_t, uint64_t, std::vector<float>&)>;

inline ReferenceResult run_reference(const Topology& topo, const std::vector<float>& init,
                                     const LocalTraining& train) {
  const size_t n = init.size();
  const ChunkPlan plan = ChunkPlan::from_bytes(n, topo.federation().chunk_bytes);
  const Codec& codec = codec_by_name(topo.federation().codec);
  const bool lossy = codec.id() != CodecId::kFp32;
  std::vector<float> global = init, held = init;
  auto outer = make_outer_optimizer(topo.federation().outer, n);
  std::vector<std::vector<float>> residual(topo.nodes().size());

  auto encode = [&](const std::vector<float>& values, uint32_t node, bool with_feedback) {
    std::vector<std::vector<uint8_t>> out(plan.count());
    if (with_feedback && lossy && residual[node].empty()) residual[node].assign(n, 0.0f);
    for (uint32_t i = 0; i < plan.count(); ++i) {
      out[i].resize(codec.encoded_size(plan.size(i)));
      codec.encode(values.data() + plan.offset(i), plan.size(i),
                   with_feedback && lossy ? residual[node].data() + plan.offset(i) : nullptr,
                   out[i].data());
    }
    return out;
  };

  // Post-order: the stream a node sends to its parent for one round.
  std::function<Upstream(uint32_t, uint64_t)> upstream = [&](uint32_t idx, uint64_t round) {
    const NodeSpec& node = topo.node(idx);
    Upstream up;
    if (node.role == Role::kSite) {
      std::vector<float> local = held;
      train(idx, round, local);
      std::vector<float> delta(n);
      for (size_t k = 0; k < n; ++k) delta[k] = held[k] - local[k];
      up.chunks = encode(delta, idx, true);
      up.weight = node.weight;
      return up;
    }
    std::vector<Upstream> kids;
    for (uint32_t c : node.children) kids.push_back(upstream(c, round));
    std::vector<float> mean(n, 0.0f);
    for (const Upstream& k : kids) up.weight += k.weight;
    for (uint32_t i = 0; i < plan.count(); ++i) {
      float* acc = mean.data() + plan.offset(i);
      for (const Upstream& k : kids) {
        codec.decode_accumulate(k.chunks[i].data(), plan.size(i), static_cast<float>(k.weight),
                                acc);
      }
      finalize_mean(acc, plan.size(i), up.weight);
    }
    if (node.role == Role::kRoot) {
      up.chunks.clear();
      // Root: step the outer optimizer and encode the update for the children.
      std::vector<float> update(n);
      for (uint32_t i = 0; i < plan.count(); ++i) {
        const size_t off = plan.offset(i);
        outer->step(global.data() + off, mean.data() + off, off, plan.size(i));
      }
      for (size_t k = 0; k < n; ++k) update[k] = global[k] - held[k];
      for (const auto& chunk : encode(update, idx, false)) up.chunks.push_back(chunk);
      return up;
    }
    up.chunks = encode(mean, idx, true);
    return up;
  };

  const uint32_t root = topo.root().index;
  for (uint64_t r = 0; r < topo.federation().rounds; ++r) {
    outer->begin_round(r);
    Upstream down = upstream(root, r);
    for (uint32_t i = 0; i < plan.count(); ++i) {
      codec.decode_accumulate(down.chunks[i].data(), plan.size(i), 1.0f,
                              held.data() + plan.offset(i));
    }
  }
  return {global, held};
}

}  // namespace fedwan::testing
