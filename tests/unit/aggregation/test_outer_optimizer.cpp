#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fedwan/error.hpp"
#include "fedwan/outer_optimizer.hpp"

namespace fedwan {
namespace {

OuterOptimizerSpec spec_for(const std::string& name) {
  OuterOptimizerSpec spec;
  spec.name = name;
  return spec;
}

std::vector<float> random_vector(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A state buffer's values, copied.
std::vector<float> values(const OuterOptimizer::StateBuffer& b) {
  return std::vector<float>(b.data, b.data + b.size);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

void expect_bit_identical(const std::vector<float>& a, const std::vector<float>& b,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(bits(a[i]), bits(b[i]))
        << what << " differs at " << i << ": " << a[i] << " vs " << b[i];
  }
}

void step_whole(OuterOptimizer& opt, uint64_t round, std::vector<float>& params,
                const std::vector<float>& grad) {
  opt.begin_round(round);
  opt.step(params.data(), grad.data(), 0, params.size());
}

// Tolerance for float results against a double reference of the same
// formula: a few float roundings per step, relative to the magnitude.
void expect_close(const std::vector<float>& got, const std::vector<double>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], ref[i], 2e-6 * (1.0 + std::abs(ref[i]))) << "at " << i;
  }
}

// ---- registry and spec validation -----------------------------------------

TEST(OuterOptimizerRegistry, ListsEveryOptimizerInOrder) {
  EXPECT_EQ(outer_optimizer_names(), (std::vector<std::string>{"fedavg", "diloco", "fedadam"}));
}

TEST(OuterOptimizerRegistry, BuildsEachNamedOptimizerWithDefaults) {
  for (const auto& name : outer_optimizer_names()) {
    auto opt = make_outer_optimizer(spec_for(name), 8);
    ASSERT_NE(opt, nullptr);
    EXPECT_EQ(opt->name(), name);
  }
}

TEST(OuterOptimizerRegistry, EachOptimizerDeclaresItsHyperParameters) {
  auto names_of = [](const std::string& optimizer) {
    std::vector<std::string> names;
    for (const auto& p : outer_optimizer_params(optimizer)) names.push_back(p.name);
    return names;
  };
  EXPECT_EQ(names_of("fedavg"), (std::vector<std::string>{"lr"}));
  EXPECT_EQ(names_of("diloco"), (std::vector<std::string>{"lr", "momentum", "lr_warmup_rounds"}));
  EXPECT_EQ(names_of("fedadam"), (std::vector<std::string>{"lr", "beta1", "beta2", "eps"}));
  for (const auto& name : outer_optimizer_names()) {
    for (const auto& p : outer_optimizer_params(name)) {
      SCOPED_TRACE(name + "." + p.name);
      EXPECT_FALSE(p.range.empty());
      EXPECT_FALSE(p.help.empty());
      // The default is a value the optimizer accepts.
      OuterOptimizerSpec spec = spec_for(name);
      spec.params[p.name] = p.default_value;
      EXPECT_EQ(outer_optimizer_problem(spec), std::nullopt);
    }
  }
  EXPECT_EQ(outer_optimizer_params("diloco")[1].default_value, 0.9);
  EXPECT_THROW(outer_optimizer_params("sgd"), ConfigError);
}

TEST(OuterOptimizerRegistry, UnknownNameListsTheKnownOnes) {
  try {
    make_outer_optimizer(spec_for("x"), 4);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "unknown outer optimizer 'x'; known: fedavg, diloco, fedadam");
  }
  EXPECT_THROW(make_outer_optimizer(spec_for(""), 4), ConfigError);
  EXPECT_THROW(make_outer_optimizer(spec_for("FedAvg"), 4), ConfigError);
}

struct BadSpec {
  OuterOptimizerSpec spec;
  std::string param;  // the message must name it
};

std::vector<BadSpec> bad_specs() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<BadSpec> cases;
  auto add = [&](const std::string& name, const std::string& param, double value) {
    BadSpec c{spec_for(name), param};
    c.spec.params[param] = value;
    cases.push_back(c);
  };
  for (const auto& name : outer_optimizer_names()) {
    for (double v : {0.0, -0.5, nan, inf, -inf, 1e300, 1e-50}) add(name, "lr", v);
  }
  // 1 - 1e-10 is below 1 as a double but rounds to exactly 1.0f.
  for (double v : {1.0, 1.5, -0.1, nan, inf, 1.0 - 1e-10}) {
    add("diloco", "momentum", v);
    add("fedadam", "beta1", v);
    add("fedadam", "beta2", v);
  }
  for (double v : {0.0, -1e-3, nan, inf, 1e-50}) add("fedadam", "eps", v);
  // Set but unused: refused so that a typo in a config is not silently ignored.
  add("fedavg", "momentum", 0.9);
  add("fedavg", "beta1", 0.9);
  add("fedavg", "beta2", 0.99);
  add("fedavg", "eps", 1e-3);
  add("diloco", "beta1", 0.9);
  add("diloco", "beta2", 0.99);
  add("diloco", "eps", 1e-3);
  add("fedadam", "momentum", 0.9);
  return cases;
}

TEST(OuterOptimizerSpecValidation, EveryInvalidSpecNamesTheBadParameter) {
  for (const auto& c : bad_specs()) {
    SCOPED_TRACE(c.spec.name + " " + c.param);
    try {
      make_outer_optimizer(c.spec, 4);
      ADD_FAILURE() << "expected ConfigError";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.param), std::string::npos) << what;
      EXPECT_NE(what.find("'" + c.spec.name + "'"), std::string::npos) << what;
    }
  }
}

TEST(OuterOptimizerSpecValidation, UnusedParameterMessageSaysWhatIsTaken) {
  auto spec = spec_for("fedavg");
  spec.params["momentum"] = 0.9;
  try {
    make_outer_optimizer(spec, 4);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "outer optimizer 'fedavg': does not use 'momentum'; it takes lr");
  }
}

TEST(OuterOptimizerSpecValidation, AcceptsBoundaryValues) {
  auto diloco = spec_for("diloco");
  diloco.params["momentum"] = 0.0;
  diloco.params["lr"] = 1e-30;
  EXPECT_NO_THROW(make_outer_optimizer(diloco, 4));
  auto adam = spec_for("fedadam");
  adam.params["beta1"] = 0.0;
  adam.params["beta2"] = 0.0;
  adam.params["eps"] = 1e-30;
  adam.params["lr"] = 100.0;
  EXPECT_NO_THROW(make_outer_optimizer(adam, 4));
}

TEST(OuterOptimizerSpecValidation, ExplicitDefaultsBehaveLikeUnsetOnes) {
  std::vector<std::pair<OuterOptimizerSpec, OuterOptimizerSpec>> pairs;
  auto fedavg = spec_for("fedavg");
  fedavg.params["lr"] = 1.0;
  auto diloco = spec_for("diloco");
  diloco.params["lr"] = 0.7;
  diloco.params["momentum"] = 0.9;
  auto fedadam = spec_for("fedadam");
  fedadam.params["lr"] = 0.01;
  fedadam.params["beta1"] = 0.9;
  fedadam.params["beta2"] = 0.99;
  fedadam.params["eps"] = 1e-3;
  for (const auto& explicit_spec : {fedavg, diloco, fedadam}) {
    SCOPED_TRACE(explicit_spec.name);
    const size_t n = 64;
    auto a = make_outer_optimizer(spec_for(explicit_spec.name), n);
    auto b = make_outer_optimizer(explicit_spec, n);
    auto pa = random_vector(n, 1, -1, 1);
    auto pb = pa;
    for (uint64_t round = 0; round < 3; ++round) {
      const auto g = random_vector(n, 100 + round, -1, 1);
      step_whole(*a, round, pa, g);
      step_whole(*b, round, pb, g);
    }
    expect_bit_identical(pa, pb, "params");
  }
}

// ---- step range and state ---------------------------------------------------

TEST(OuterOptimizerStep, RejectsRangesPastTheModel) {
  for (const auto& name : outer_optimizer_names()) {
    SCOPED_TRACE(name);
    auto opt = make_outer_optimizer(spec_for(name), 10);
    opt->begin_round(0);
    std::vector<float> p(16, 1.0f), g(16, 1.0f);
    EXPECT_THROW(opt->step(p.data(), g.data(), 0, 11), Error);
    EXPECT_THROW(opt->step(p.data(), g.data(), 8, 3), Error);
    EXPECT_THROW(opt->step(p.data(), g.data(), 11, 0), Error);
    EXPECT_THROW(opt->step(p.data(), g.data(), std::numeric_limits<size_t>::max(), 2), Error);
    EXPECT_EQ(p, std::vector<float>(16, 1.0f)) << "a rejected step must not touch params";
    EXPECT_NO_THROW(opt->step(p.data(), g.data(), 10, 0));
    EXPECT_NO_THROW(opt->step(p.data(), g.data(), 7, 3));
  }
}

TEST(OuterOptimizerState, ExposesNamedZeroedBuffersOfModelSize) {
  const size_t n = 37;
  const std::vector<std::pair<std::string, std::vector<std::string>>> expected = {
      {"fedavg", {}}, {"diloco", {"momentum"}}, {"fedadam", {"first_moment", "second_moment"}}};
  for (const auto& [name, buffers] : expected) {
    SCOPED_TRACE(name);
    auto opt = make_outer_optimizer(spec_for(name), n);
    const auto state = opt->state();
    ASSERT_EQ(state.size(), buffers.size());
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_EQ(state[i].name, buffers[i]);
      ASSERT_NE(state[i].data, nullptr);
      EXPECT_EQ(values(state[i]), std::vector<float>(n, 0.0f));
    }
  }
}

TEST(OuterOptimizerState, RestoringStateResumesBitIdentically) {
  const size_t n = 257;
  for (const auto& name : outer_optimizer_names()) {
    SCOPED_TRACE(name);
    auto original = make_outer_optimizer(spec_for(name), n);
    auto params = random_vector(n, 3, -2, 2);
    for (uint64_t round = 0; round < 4; ++round)
      step_whole(*original, round, params, random_vector(n, 10 + round, -1, 1));

    // What a checkpoint would carry: params plus every state buffer by name.
    auto restored = make_outer_optimizer(spec_for(name), n);
    auto restored_params = params;
    auto from = original->state();
    auto to = restored->state();
    ASSERT_EQ(from.size(), to.size());
    for (size_t i = 0; i < from.size(); ++i) {
      ASSERT_EQ(from[i].name, to[i].name);
      ASSERT_EQ(to[i].size, from[i].size);
      std::copy(from[i].data, from[i].data + from[i].size, to[i].data);
    }
    for (uint64_t round = 4; round < 7; ++round) {
      const auto g = random_vector(n, 10 + round, -1, 1);
      step_whole(*original, round, params, g);
      step_whole(*restored, round, restored_params, g);
    }
    expect_bit_identical(params, restored_params, "params");
  }
}

// ---- chunked stepping -------------------------------------------------------

class OuterOptimizerChunking : public ::testing::TestWithParam<std::string> {};

// The root steps each chunk when it completes, in arrival order: the result
// must not depend on how the model was cut or in which order chunks came.
TEST_P(OuterOptimizerChunking, ShuffledChunksMatchOneWholeStepBitForBit) {
  const size_t n = 1037;
  auto whole = make_outer_optimizer(spec_for(GetParam()), n);
  auto chunked = make_outer_optimizer(spec_for(GetParam()), n);
  auto p_whole = random_vector(n, 7, -3, 3);
  auto p_chunked = p_whole;
  std::mt19937 rng(42);
  for (uint64_t round = 0; round < 5; ++round) {
    const auto g = random_vector(n, 1000 + round, -2, 2);
    step_whole(*whole, round, p_whole, g);

    std::vector<size_t> cuts{0, n};
    std::uniform_int_distribution<size_t> pos(1, n - 1);
    for (int i = 0; i < 9; ++i) cuts.push_back(pos(rng));
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::pair<size_t, size_t>> chunks;  // (offset, length); empty chunks allowed
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      chunks.emplace_back(cuts[i], cuts[i + 1] - cuts[i]);
    std::shuffle(chunks.begin(), chunks.end(), rng);

    chunked->begin_round(round);
    for (const auto& [offset, len] : chunks) {
      chunked->step(p_chunked.data() + offset, g.data() + offset, offset, len);
    }
    expect_bit_identical(p_whole, p_chunked, "params after round " + std::to_string(round));
  }
  const auto sw = whole->state();
  const auto sc = chunked->state();
  ASSERT_EQ(sw.size(), sc.size());
  for (size_t i = 0; i < sw.size(); ++i)
    expect_bit_identical(values(sw[i]), values(sc[i]), sw[i].name);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, OuterOptimizerChunking,
                         ::testing::ValuesIn(outer_optimizer_names()),
                         [](const auto& info) { return info.param; });

// ---- FedAvg -----------------------------------------------------------------

TEST(FedAvgOptimizer, LrOneGivesParamsMinusPseudoGradientExactly) {
  const size_t n = 513;
  auto opt = make_outer_optimizer(spec_for("fedavg"), n);
  auto params = random_vector(n, 5, -10, 10);
  const auto g = random_vector(n, 6, -1, 1);
  std::vector<float> expected(n);
  for (size_t i = 0; i < n; ++i) expected[i] = params[i] - g[i];
  step_whole(*opt, 0, params, g);
  expect_bit_identical(params, expected, "params");
}

TEST(FedAvgOptimizer, HandComputedSteps) {
  auto spec = spec_for("fedavg");
  spec.params["lr"] = 0.5;
  auto opt = make_outer_optimizer(spec, 2);
  std::vector<float> params{1.0f, -2.0f};
  const std::vector<float> g{0.5f, -4.0f};
  step_whole(*opt, 0, params, g);  // 1 - 0.25; -2 + 2
  EXPECT_EQ(params, (std::vector<float>{0.75f, 0.0f}));
  step_whole(*opt, 1, params, g);  // no state: the same move again
  EXPECT_EQ(params, (std::vector<float>{0.5f, 2.0f}));
}

TEST(FedAvgOptimizer, MatchesDoubleReference) {
  const size_t n = 100;
  auto spec = spec_for("fedavg");
  spec.params["lr"] = 0.3;
  auto opt = make_outer_optimizer(spec, n);
  auto params = random_vector(n, 8, -2, 2);
  std::vector<double> ref(params.begin(), params.end());
  const double lr = 0.3f;
  for (uint64_t round = 0; round < 5; ++round) {
    const auto g = random_vector(n, 20 + round, -1, 1);
    step_whole(*opt, round, params, g);
    for (size_t i = 0; i < n; ++i) ref[i] -= lr * g[i];
  }
  expect_close(params, ref);
}

// ---- DiLoCo -----------------------------------------------------------------

TEST(DiLoCoOptimizer, HandComputedStepsWithDefaults) {
  auto opt = make_outer_optimizer(spec_for("diloco"), 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{0.5f};
  // buf = 0.5; p = 1 - 0.7 * (0.5 + 0.9 * 0.5) = 1 - 0.665
  step_whole(*opt, 0, p, g);
  EXPECT_NEAR(p[0], 0.335, 1e-6);
  EXPECT_NEAR(opt->state()[0].data[0], 0.5, 1e-7);
  // buf = 0.45 + 0.5 = 0.95; p = 0.335 - 0.7 * (0.5 + 0.855) = 0.335 - 0.9485
  step_whole(*opt, 1, p, g);
  EXPECT_NEAR(p[0], -0.6135, 1e-6);
  EXPECT_NEAR(opt->state()[0].data[0], 0.95, 1e-7);
}

TEST(DiLoCoOptimizer, MomentumPersistsAcrossRounds) {
  auto opt = make_outer_optimizer(spec_for("diloco"), 2);
  std::vector<float> p{1.0f, 1.0f};
  step_whole(*opt, 0, p, {0.5f, 0.5f});
  step_whole(*opt, 1, p, {0.5f, 0.5f});
  // A round with a zero pseudo-gradient still moves the model by what
  // momentum carried over: buf = 0.9 * 0.95 = 0.855; p -= 0.7 * 0.9 * 0.855.
  const std::vector<float> before = p;
  step_whole(*opt, 2, p, {0.0f, 0.0f});
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(before[i] - p[i], 0.53865, 1e-6);
    EXPECT_NEAR(p[i], -1.15215, 1e-6);
  }
  EXPECT_NEAR(opt->state()[0].data[0], 0.855, 1e-7);
}

TEST(DiLoCoOptimizer, ZeroMomentumIsPlainSgd) {
  auto spec = spec_for("diloco");
  spec.params["lr"] = 0.5;
  spec.params["momentum"] = 0.0;
  auto opt = make_outer_optimizer(spec, 1);
  std::vector<float> p{1.0f};
  step_whole(*opt, 0, p, {0.5f});
  step_whole(*opt, 1, p, {0.0f});
  EXPECT_EQ(p[0], 0.75f);
}

TEST(DiLoCoOptimizer, LearningRateWarmsUpLinearlyOverTheFirstRounds) {
  auto spec = spec_for("diloco");
  spec.params["lr"] = 0.8;
  spec.params["momentum"] = 0.0;  // params -= lr_r * g: the step shows lr_r
  spec.params["lr_warmup_rounds"] = 4;
  auto opt = make_outer_optimizer(spec, 1);
  const float lr = 0.8f;
  const std::vector<float> expected = {static_cast<float>(double(lr) * 1 / 4),
                                       static_cast<float>(double(lr) * 2 / 4),
                                       static_cast<float>(double(lr) * 3 / 4),
                                       lr,
                                       lr,
                                       lr};
  for (uint64_t round = 0; round < expected.size(); ++round) {
    std::vector<float> p{0.0f};
    step_whole(*opt, round, p, {-1.0f});
    EXPECT_EQ(p[0], expected[round]) << "round " << round;
  }
  // A root resumed at round 2 ramps from where the schedule stands, not from 0.
  auto resumed = make_outer_optimizer(spec, 1);
  std::vector<float> p{0.0f};
  step_whole(*resumed, 2, p, {-1.0f});
  EXPECT_EQ(p[0], expected[2]);
}

TEST(DiLoCoOptimizer, WarmupRoundsMustBeAWholeNumber) {
  for (double bad : {-1.0, 2.5, 1e12}) {
    auto spec = spec_for("diloco");
    spec.params["lr_warmup_rounds"] = bad;
    EXPECT_THROW(make_outer_optimizer(spec, 1), ConfigError) << bad;
  }
  auto fedavg = spec_for("fedavg");
  fedavg.params["lr_warmup_rounds"] = 3;
  EXPECT_THROW(make_outer_optimizer(fedavg, 1), ConfigError);
}

TEST(DiLoCoOptimizer, MatchesDoubleReference) {
  const size_t n = 100;
  auto spec = spec_for("diloco");
  spec.params["lr"] = 0.6;
  spec.params["momentum"] = 0.8;
  auto opt = make_outer_optimizer(spec, n);
  auto params = random_vector(n, 9, -2, 2);
  std::vector<double> ref(params.begin(), params.end());
  std::vector<double> buf(n, 0.0);
  const double lr = 0.6f;
  const double m = 0.8f;
  for (uint64_t round = 0; round < 6; ++round) {
    const auto g = random_vector(n, 30 + round, -1, 1);
    step_whole(*opt, round, params, g);
    for (size_t i = 0; i < n; ++i) {
      buf[i] = m * buf[i] + g[i];
      ref[i] -= lr * (g[i] + m * buf[i]);
    }
  }
  expect_close(params, ref);
  const auto momentum = values(opt->state()[0]);
  expect_close(momentum, buf);
}

// The step in fp32, one rounding per product and sum, the same bits on
// every path (eight values at a time where the CPU can), at any offset and
// length.
TEST(DiLoCoOptimizer, StepsEveryValueAsTheFp32FormulaDoes) {
  const size_t total = 1037;
  auto spec = spec_for("diloco");
  spec.params["lr"] = 0.7;
  spec.params["momentum"] = 0.9;
  auto opt = make_outer_optimizer(spec, total);
  std::vector<float> params = random_vector(total, 5, -2, 2), ref = params, buf(total, 0.0f);
  const float lr = 0.7f, m = 0.9f;
  opt->begin_round(0);
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t off : {size_t{0}, size_t{3}, size_t{17}, size_t{500}}) {
      const size_t n = std::min<size_t>(total - off, 9 + 61 * off % 400);
      const auto g = random_vector(n, 40 + static_cast<uint32_t>(off + pass), -1, 1);
      opt->step(params.data() + off, g.data(), off, n);
      for (size_t i = 0; i < n; ++i) {
        const float b = m * buf[off + i] + g[i];
        buf[off + i] = b;
        ref[off + i] -= lr * (g[i] + m * b);
      }
    }
  }
  ASSERT_EQ(std::memcmp(params.data(), ref.data(), total * sizeof(float)), 0);
  ASSERT_EQ(std::memcmp(opt->state()[0].data, buf.data(), total * sizeof(float)), 0);
}

// ---- FedAdam ----------------------------------------------------------------

TEST(FedAdamOptimizer, HandComputedStepsWithDefaults) {
  auto opt = make_outer_optimizer(spec_for("fedadam"), 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{0.5f};
  // m = 0.05; v = 0.0025; p = 1 - 0.01 * 0.05 / (0.05 + 0.001) = 1 - 1/102
  step_whole(*opt, 0, p, g);
  EXPECT_NEAR(p[0], 101.0 / 102.0, 1e-6);
  // m = 0.045 + 0.05 = 0.095; v = 0.002475 + 0.0025 = 0.004975;
  // p -= 0.01 * 0.095 / (sqrt(0.004975) + 0.001) = 0.0132804...
  step_whole(*opt, 1, p, g);
  EXPECT_NEAR(p[0], 0.9769156208713781, 1e-6);
  const auto state = opt->state();
  EXPECT_NEAR(state[0].data[0], 0.095, 1e-7);
  EXPECT_NEAR(state[1].data[0], 0.004975, 1e-8);
}

// Without bias correction, a constant g from zero state gives after t steps
// m = (1 - b1^t) g and v = (1 - b2^t) g^2, so step t moves each coordinate by
//   -lr * (1 - b1^t) * g / (sqrt(1 - b2^t) * |g| + eps).
// With the defaults (1 - b1) = sqrt(1 - b2) = 0.1, so step 1 is exactly
// lr * g / (|g| + 10 eps): about lr * sign(g) when |g| >> eps. Later steps
// overshoot (up to ~2.13 lr near t = 13) and tend back to lr * sign(g).
TEST(FedAdamOptimizer, ConstantGradientFollowsClosedForm) {
  const std::vector<float> g{-3.0f, -0.25f, 0.0f, 0.5f, 100.0f};
  const size_t n = g.size();
  auto opt = make_outer_optimizer(spec_for("fedadam"), n);
  const double lr = 0.01f, b1 = 0.9f, b2 = 0.99f, eps = 1e-3f;
  std::vector<float> p(n, 0.0f);
  std::vector<double> ref(n, 0.0);
  for (int t = 1; t <= 40; ++t) {
    step_whole(*opt, t - 1, p, g);
    for (size_t i = 0; i < n; ++i) {
      const double gi = g[i];
      ref[i] -=
          lr * (1 - std::pow(b1, t)) * gi / (std::sqrt(1 - std::pow(b2, t)) * std::abs(gi) + eps);
    }
    if (t == 1) {
      for (size_t i = 0; i < n; ++i)
        EXPECT_NEAR(p[i], -lr * g[i] / (std::abs(g[i]) + 10 * eps), 1e-8);
      EXPECT_NEAR(p[4], -0.01, 1e-6) << "a large gradient moves by about lr";
      EXPECT_EQ(p[2], 0.0f) << "a zero gradient does not move";
    }
    expect_close(p, ref);
  }
}

TEST(FedAdamOptimizer, ConstantGradientStepTendsToLrTimesSign) {
  const std::vector<float> g{-3.0f, -0.25f, 0.5f, 100.0f};
  const size_t n = g.size();
  auto spec = spec_for("fedadam");
  spec.params["eps"] = 1e-12;  // so that the move is independent of |g|
  auto opt = make_outer_optimizer(spec, n);
  std::vector<float> p(n, 0.0f);
  for (uint64_t round = 0; round < 3000; ++round) step_whole(*opt, round, p, g);
  // Params do not enter the update: measure one step from zero.
  std::fill(p.begin(), p.end(), 0.0f);
  step_whole(*opt, 3000, p, g);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], g[i] > 0 ? -0.01 : 0.01, 1e-7) << "at " << i;
}

TEST(FedAdamOptimizer, MatchesDoubleReference) {
  const size_t n = 100;
  auto spec = spec_for("fedadam");
  spec.params["lr"] = 0.05;
  spec.params["beta1"] = 0.8;
  spec.params["beta2"] = 0.95;
  spec.params["eps"] = 1e-2;
  auto opt = make_outer_optimizer(spec, n);
  auto params = random_vector(n, 11, -2, 2);
  std::vector<double> ref(params.begin(), params.end());
  std::vector<double> m(n, 0.0), v(n, 0.0);
  const double lr = 0.05f, b1 = 0.8f, b2 = 0.95f, eps = 1e-2f;
  for (uint64_t round = 0; round < 6; ++round) {
    const auto g = random_vector(n, 40 + round, -1, 1);
    step_whole(*opt, round, params, g);
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      ref[i] -= lr * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
  expect_close(params, ref);
  const auto state = opt->state();
  expect_close(values(state[0]), m);
  expect_close(values(state[1]), v);
}

}  // namespace
}  // namespace fedwan
