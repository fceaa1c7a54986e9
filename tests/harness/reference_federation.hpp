// An in-process reference of the whole federation: the same codecs, the same
// aggregation rule and the same outer optimizer, applied in a fixed order with no
// sockets. With at most two children per aggregator the arrival order cannot
// change a float sum, so a real federation must match it bit for bit.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "aggregation/aggregation_rule.hpp"
#include "aggregation/round_accumulator.hpp"
#include "aggregator/root_model.hpp"
#include "codec/compact_feedback.hpp"
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
// Local training in steps: (site index, steps, params in/out).
using LocalSteps = std::function<void(uint32_t, uint64_t, std::vector<float>&)>;

// How the sites keep their error feedback: in bf16 as a site encoding on
// the host does, or in fp32 as one with an UpdateEncoder (a GPU's) does.
enum class SiteResidual { kBf16, kFp32 };

// The federation around its sites: `site_params(site, round, anchor)` gives
// the params a site sends its update from (the update is anchor - them);
// `after_round(round, new anchor)` runs once the anchor of round+1 is known.
inline ReferenceResult run_reference_rounds(
    const Topology& topo, const std::vector<float>& init,
    const std::function<std::vector<float>(uint32_t, uint64_t, const std::vector<float>&)>&
        site_params,
    const std::function<void(uint64_t, const std::vector<float>&)>& after_round,
    SiteResidual site_residual = SiteResidual::kBf16) {
  const size_t n = init.size();
  const tensor::ChunkPlan plan = tensor::ChunkPlan::from_bytes(n, topo.federation().chunk_bytes);
  const Codec& codec = codec_by_name(topo.federation().codec);
  const bool lossy = codec.id() != CodecId::kFp32;
  // The root's model: the anchor plus a bf16 residual (aggregator/root_model.hpp).
  aggregator::RootModel model(init);
  std::vector<float> held = init;
  auto outer = make_outer_optimizer(topo.federation().outer, n);
  const auto rule = aggregation::make_rule(topo.federation().aggregation.rule,
                                           topo.federation().aggregation.params);
  // Regions' residuals in bf16 (codec/compact_feedback.hpp), sites' as
  // `site_residual` says.
  std::vector<std::vector<uint16_t>> residual(topo.nodes().size());
  std::vector<std::vector<float>> fp32_residual(topo.nodes().size());
  std::vector<float> scratch;

  auto encode = [&](const std::vector<float>& values, uint32_t node, bool with_feedback) {
    std::vector<std::vector<uint8_t>> out(plan.count());
    const bool feedback = with_feedback && lossy;
    const bool fp32 =
        feedback && site_residual == SiteResidual::kFp32 && topo.node(node).role == Role::kSite;
    if (feedback && !fp32 && residual[node].empty()) residual[node].assign(n, 0);  // bf16 zeros
    if (fp32 && fp32_residual[node].empty()) fp32_residual[node].assign(n, 0.0f);
    for (uint32_t i = 0; i < plan.count(); ++i) {
      out[i].resize(codec.encoded_size(plan.size(i)));
      if (fp32) {
        codec.encode(values.data() + plan.offset(i), plan.size(i),
                     fp32_residual[node].data() + plan.offset(i), out[i].data());
      } else if (feedback) {
        fedwan::codec::encode_with_bf16_residual(
            codec, values.data() + plan.offset(i), plan.size(i),
            residual[node].data() + plan.offset(i), scratch, out[i].data());
      } else {
        codec.encode(values.data() + plan.offset(i), plan.size(i), nullptr, out[i].data());
      }
    }
    return out;
  };

  // Post-order: the stream a node sends to its parent for one round.
  std::function<Upstream(uint32_t, uint64_t)> upstream = [&](uint32_t idx, uint64_t round) {
    const NodeSpec& node = topo.node(idx);
    Upstream up;
    if (node.role == Role::kSite) {
      const std::vector<float> local = site_params(idx, round, held);
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
      // The topology's rule, fed the children in their fixed order.
      auto combiner = rule->begin_chunk(plan.size(i), kids.size());
      std::vector<float> values(plan.size(i));
      for (uint32_t slot = 0; slot < kids.size(); ++slot) {
        codec.decode(kids[slot].chunks[i].data(), values.size(), values.data());
        combiner->add(slot, values.data(), kids[slot].weight);
      }
      const std::vector<float> combined = combiner->finish().values;
      std::copy(combined.begin(), combined.end(), mean.begin() + plan.offset(i));
    }
    if (node.role == Role::kRoot) {
      up.chunks.clear();
      // Root: step the outer optimizer and encode the update for the children.
      for (uint32_t i = 0; i < plan.count(); ++i) {
        const size_t off = plan.offset(i);
        const uint32_t size = plan.size(i);
        std::vector<float> global(size), update(size);
        model.global_chunk(off, size, global.data());
        outer->step(global.data(), mean.data() + off, off, size);
        for (uint32_t k = 0; k < size; ++k) update[k] = global[k] - model.held()[off + k];
        std::vector<uint8_t> payload(codec.encoded_size(size));
        codec.encode(update.data(), size, nullptr, payload.data());
        model.settle_chunk(off, size, global.data(), codec, payload.data());
        up.chunks.push_back(std::move(payload));
      }
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
      model.apply(plan.offset(i), plan.size(i), codec, down.chunks[i].data());
    }
    after_round(r, held);
  }
  return {model.global(), held};
}

// Blocking rounds: every site trains a round from the anchor.
inline ReferenceResult run_reference(const Topology& topo, const std::vector<float>& init,
                                     const LocalTraining& train,
                                     SiteResidual site_residual = SiteResidual::kBf16) {
  return run_reference_rounds(
      topo, init,
      [&](uint32_t site, uint64_t round, const std::vector<float>& anchor) {
        std::vector<float> local = anchor;
        train(site, round, local);
        return local;
      },
      [](uint64_t, const std::vector<float>&) {}, site_residual);
}

// Overlapped rounds (federation.overlap_steps = tau): a site sends its
// update after H steps, trains tau more, then merges the new anchor keeping
// that progress (params += new anchor - params sent) and trains H - tau
// steps to its next update; after the last round it holds the final model.
inline ReferenceResult run_reference_overlap(const Topology& topo, const std::vector<float>& init,
                                             const LocalSteps& steps) {
  const uint64_t h = topo.federation().inner_steps;
  const uint64_t tau = topo.federation().overlap_steps;
  const uint64_t rounds = topo.federation().rounds;
  std::vector<std::vector<float>> local(topo.nodes().size()), sent(topo.nodes().size());
  return run_reference_rounds(
      topo, init,
      [&](uint32_t site, uint64_t round, const std::vector<float>&) {
        if (round == 0) local[site] = init;
        steps(site, round == 0 ? h : h - tau, local[site]);
        sent[site] = local[site];
        return local[site];
      },
      [&](uint64_t round, const std::vector<float>& anchor) {
        for (const NodeSpec& node : topo.nodes()) {
          if (node.role != Role::kSite) continue;
          std::vector<float>& p = local[node.index];
          if (round + 1 == rounds) {
            p = anchor;
            continue;
          }
          steps(node.index, tau, p);
          for (size_t k = 0; k < p.size(); ++k) p[k] += anchor[k] - sent[node.index][k];
        }
      });
}

}  // namespace fedwan::testing
