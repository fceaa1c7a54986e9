// MetricsRegistry (metrics/metrics_registry.hpp): the exposition text a
// Prometheus server parses, definitions that must agree, and updates from
// many threads.
#include "metrics/metrics_registry.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fedwan/error.hpp"

namespace fedwan::metrics {
namespace {

TEST(MetricsRegistry, CounterExpositionSortsChildrenAndEscapes) {
  MetricsRegistry registry;
  auto& bytes = registry.counter("fedwan_link_bytes_total", "Bytes moved.\nPer link \\ direction.",
                                 {"link", "direction"});
  bytes.with({"site-1", "sent"}).add(5);
  bytes.with({"site-0", "sent"}).add(3);
  bytes.with({"say \"hi\"\\\n", "received"}).inc();
  EXPECT_EQ(registry.render(),
            "# HELP fedwan_link_bytes_total Bytes moved.\\nPer link \\\\ direction.\n"
            "# TYPE fedwan_link_bytes_total counter\n"
            "fedwan_link_bytes_total{link=\"say \\\"hi\\\"\\\\\\n\",direction=\"received\"} 1\n"
            "fedwan_link_bytes_total{link=\"site-0\",direction=\"sent\"} 3\n"
            "fedwan_link_bytes_total{link=\"site-1\",direction=\"sent\"} 5\n");
}

TEST(MetricsRegistry, GaugeAndDoubleCounterExposition) {
  MetricsRegistry registry;
  auto& g = registry.gauge("fedwan_round_lag", "Rounds behind.", {"site"});
  g.with({"a"}).set(0.5);
  g.with({"b"}).set(-2);
  g.with({"c"}).set(std::numeric_limits<double>::infinity());
  g.with({"d"}).set(std::nan(""));
  g.with({"e"}).set(1234567);
  g.with({"e"}).add(1);
  registry.double_counter("fedwan_encode_seconds_total", "Time spent encoding.").get().add(0.25);
  registry.double_counter("fedwan_encode_seconds_total", "Time spent encoding.").get().add(-1);
  registry.gauge("fedwan_up", "").get().set(1);
  EXPECT_EQ(registry.render(), "# HELP fedwan_encode_seconds_total Time spent encoding.\n"
                               "# TYPE fedwan_encode_seconds_total counter\n"
                               "fedwan_encode_seconds_total 0.25\n"
                               "# HELP fedwan_round_lag Rounds behind.\n"
                               "# TYPE fedwan_round_lag gauge\n"
                               "fedwan_round_lag{site=\"a\"} 0.5\n"
                               "fedwan_round_lag{site=\"b\"} -2\n"
                               "fedwan_round_lag{site=\"c\"} +Inf\n"
                               "fedwan_round_lag{site=\"d\"} NaN\n"
                               "fedwan_round_lag{site=\"e\"} 1234568\n"
                               "# HELP fedwan_up \n"
                               "# TYPE fedwan_up gauge\n"
                               "fedwan_up 1\n");
}

TEST(MetricsRegistry, HistogramExpositionIsCumulativeWithInclusiveBounds) {
  MetricsRegistry registry;
  auto& h = registry.histogram("fedwan_chunk_latency_seconds", "Chunk latency.", {"codec"},
                               {0.25, 0.5, 1, 2.5});
  Histogram& fp16 = h.with({"fp16"});
  for (double v : {0.25, 0.5, 0.75, 3.0, 0.125}) fp16.observe(v);
  h.with({"bf16"});  // a child with no observations yet
  EXPECT_EQ(registry.render(), "# HELP fedwan_chunk_latency_seconds Chunk latency.\n"
                               "# TYPE fedwan_chunk_latency_seconds histogram\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"bf16\",le=\"0.25\"} 0\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"bf16\",le=\"0.5\"} 0\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"bf16\",le=\"1\"} 0\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"bf16\",le=\"2.5\"} 0\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"bf16\",le=\"+Inf\"} 0\n"
                               "fedwan_chunk_latency_seconds_sum{codec=\"bf16\"} 0\n"
                               "fedwan_chunk_latency_seconds_count{codec=\"bf16\"} 0\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"fp16\",le=\"0.25\"} 2\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"fp16\",le=\"0.5\"} 3\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"fp16\",le=\"1\"} 4\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"fp16\",le=\"2.5\"} 4\n"
                               "fedwan_chunk_latency_seconds_bucket{codec=\"fp16\",le=\"+Inf\"} 5\n"
                               "fedwan_chunk_latency_seconds_sum{codec=\"fp16\"} 4.625\n"
                               "fedwan_chunk_latency_seconds_count{codec=\"fp16\"} 5\n");
}

TEST(MetricsRegistry, HistogramWithoutLabels) {
  MetricsRegistry registry;
  auto& h = registry.histogram("fedwan_round_seconds", "Round time.", {}, {1});
  h.get().observe(2);
  h.get().observe(std::nan(""));  // counted in +Inf only
  const std::string text = registry.render();
  EXPECT_NE(text.find("fedwan_round_seconds_bucket{le=\"1\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fedwan_round_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fedwan_round_seconds_count 2\n"), std::string::npos) << text;
}

TEST(MetricsRegistry, FormatValueParsesBackInPrometheus) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(-0.0), "0");
  EXPECT_EQ(format_value(1), "1");
  EXPECT_EQ(format_value(-42), "-42");
  EXPECT_EQ(format_value(1e15), "1000000000000000");
  EXPECT_EQ(format_value(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(123456.5), "123456.5");
  EXPECT_EQ(format_value(1e300), "1e+300");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::nan("")), "NaN");
  for (double v : {0.1, 1.0 / 3, 1e-9, 6.02e23, 123456.5}) {
    EXPECT_EQ(std::stod(format_value(v)), v) << format_value(v);
  }
}

TEST(MetricsRegistry, SameDefinitionReturnsSameFamilyAndChild) {
  MetricsRegistry registry;
  auto& a = registry.counter("fedwan_frames_total", "Frames.", {"kind"});
  auto& b = registry.counter("fedwan_frames_total", "Frames.", {"kind"});
  EXPECT_EQ(&a, &b);
  Counter& c = a.with({"data"});
  c.add(2);
  EXPECT_EQ(&b.with({"data"}), &c);
  EXPECT_EQ(b.with({"data"}).value(), 2u);
  auto& h1 = registry.histogram("fedwan_h_seconds", "H.", {}, {1, 2});
  EXPECT_EQ(&registry.histogram("fedwan_h_seconds", "H.", {}, {1, 2}), &h1);
}

TEST(MetricsRegistry, ConflictingDefinitionsThrow) {
  MetricsRegistry registry;
  registry.counter("fedwan_frames_total", "Frames.", {"kind"});
  EXPECT_THROW(registry.gauge("fedwan_frames_total", "Frames.", {"kind"}), ConfigError);
  EXPECT_THROW(registry.double_counter("fedwan_frames_total", "Frames.", {"kind"}), ConfigError);
  EXPECT_THROW(registry.counter("fedwan_frames_total", "Frames.", {"type"}), ConfigError);
  EXPECT_THROW(registry.counter("fedwan_frames_total", "Frames.", {}), ConfigError);
  EXPECT_THROW(registry.counter("fedwan_frames_total", "Other help.", {"kind"}), ConfigError);
  registry.histogram("fedwan_h_seconds", "H.", {}, {1, 2});
  EXPECT_THROW(registry.histogram("fedwan_h_seconds", "H.", {}, {1, 3}), ConfigError);
  // A histogram's samples may not shadow another family's, nor the reverse.
  EXPECT_THROW(registry.counter("fedwan_h_seconds_count", "C."), ConfigError);
  registry.gauge("fedwan_x_sum", "X.");
  EXPECT_THROW(registry.histogram("fedwan_x", "X.", {}, {1}), ConfigError);
  try {
    registry.gauge("fedwan_frames_total", "Frames.", {"kind"});
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fedwan_frames_total"), std::string::npos) << e.what();
  }
}

TEST(MetricsRegistry, InvalidNamesAndLabelsThrow) {
  MetricsRegistry registry;
  EXPECT_THROW(registry.counter("", "x"), ConfigError);
  EXPECT_THROW(registry.counter("1fedwan", "x"), ConfigError);
  EXPECT_THROW(registry.counter("fedwan-bytes", "x"), ConfigError);
  EXPECT_NO_THROW(registry.counter(":fedwan:ok_total", "x"));
  EXPECT_THROW(registry.counter("fedwan_a", "x", {"__reserved"}), ConfigError);
  EXPECT_THROW(registry.counter("fedwan_b", "x", {"a:b"}), ConfigError);
  EXPECT_THROW(registry.counter("fedwan_c", "x", {"site", "site"}), ConfigError);
  EXPECT_THROW(registry.histogram("fedwan_d", "x", {"le"}, {1}), ConfigError);
  EXPECT_THROW(registry.histogram("fedwan_e", "x", {}, {}), ConfigError);
  EXPECT_THROW(registry.histogram("fedwan_f", "x", {}, {2, 1}), ConfigError);
  EXPECT_THROW(registry.histogram("fedwan_g", "x", {}, {1, std::nan("")}), ConfigError);
  auto& two = registry.counter("fedwan_two_total", "x", {"a", "b"});
  EXPECT_THROW(two.with({"only-one"}), ConfigError);
  EXPECT_THROW(two.get(), ConfigError);
  EXPECT_TRUE(valid_label_name("_x"));
  EXPECT_FALSE(valid_label_name("__x"));
  EXPECT_FALSE(valid_metric_name("a b"));
}

TEST(MetricsRegistry, BucketHelpers) {
  EXPECT_EQ(exponential_buckets(0.001, 10, 4), (std::vector<double>{0.001, 0.01, 0.1, 1.0}));
  EXPECT_EQ(linear_buckets(1, 2, 3), (std::vector<double>{1, 3, 5}));
  EXPECT_THROW(exponential_buckets(0, 2, 3), ConfigError);
  EXPECT_THROW(linear_buckets(0, 0, 3), ConfigError);
}

TEST(MetricsRegistry, GaugeFnIsReadAtRenderUntilItsHandleIsReset) {
  MetricsRegistry registry;
  double queue = 3;
  GaugeFnHandle a = registry.gauge_fn("fedwan_queue_depth", "Queued chunks.", {"link"}, {"up"},
                                      [&] { return queue; });
  GaugeFnHandle b = registry.gauge_fn("fedwan_queue_depth", "Queued chunks.", {"link"}, {"down"},
                                      []() -> double { throw std::runtime_error("not now"); });
  EXPECT_THROW(registry.gauge_fn("fedwan_queue_depth", "Queued chunks.", {"link"}, {"up"},
                                 [] { return 0.0; }),
               ConfigError);
  queue = 7;
  EXPECT_EQ(registry.render(), "# HELP fedwan_queue_depth Queued chunks.\n"
                               "# TYPE fedwan_queue_depth gauge\n"
                               "fedwan_queue_depth{link=\"up\"} 7\n");
  a.reset();
  EXPECT_FALSE(a);
  EXPECT_EQ(registry.render(), "# HELP fedwan_queue_depth Queued chunks.\n"
                               "# TYPE fedwan_queue_depth gauge\n");
  // The label values are free again.
  GaugeFnHandle c = registry.gauge_fn("fedwan_queue_depth", "Queued chunks.", {"link"}, {"up"},
                                      [] { return 1.0; });
  EXPECT_NE(registry.render().find("fedwan_queue_depth{link=\"up\"} 1\n"), std::string::npos);
}

TEST(MetricsRegistry, GaugeFnHandleMayOutliveTheRegistry) {
  GaugeFnHandle handle;
  {
    MetricsRegistry registry;
    handle = registry.gauge_fn("fedwan_x", "x", {}, {}, [] { return 1.0; });
  }
  handle.reset();  // nothing left to unregister from; must not touch freed memory
  SUCCEED();
}

TEST(MetricsRegistry, ConcurrentUpdatesAddUp) {
  MetricsRegistry registry;
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      // Every thread looks the families and children up itself, so creation
      // races too.
      auto& c = registry.counter("fedwan_ops_total", "Ops.", {"kind"}).with({"all"});
      auto& mine = registry.counter("fedwan_ops_total", "Ops.", {"kind"})
                       .with({"thread-" + std::to_string(t)});
      auto& secs = registry.double_counter("fedwan_busy_seconds_total", "Busy.").get();
      auto& g = registry.gauge("fedwan_level", "Level.").get();
      auto& h = registry.histogram("fedwan_size_bytes", "Sizes.", {}, {10, 100}).get();
      for (int i = 0; i < kIters; ++i) {
        c.inc();
        mine.add(2);
        secs.add(0.5);
        g.add(1);
        h.observe(i % 3 == 0 ? 5 : 50);
        if (i % 5000 == 0) (void)registry.render();  // scrapes while others update
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(registry.counter("fedwan_ops_total", "Ops.", {"kind"}).with({"all"}).value(),
            uint64_t{kThreads} * kIters);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(registry.counter("fedwan_ops_total", "Ops.", {"kind"})
                  .with({"thread-" + std::to_string(t)})
                  .value(),
              2u * kIters);
  }
  EXPECT_EQ(registry.double_counter("fedwan_busy_seconds_total", "Busy.").get().value(),
            0.5 * kThreads * kIters);
  EXPECT_EQ(registry.gauge("fedwan_level", "Level.").get().value(), double{kThreads} * kIters);
  const auto snap =
      registry.histogram("fedwan_size_bytes", "Sizes.", {}, {10, 100}).get().snapshot();
  const uint64_t small = kThreads * ((kIters + 2) / 3);
  EXPECT_EQ(snap.cumulative, (std::vector<uint64_t>{small, uint64_t{kThreads} * kIters,
                                                    uint64_t{kThreads} * kIters}));
}

}  // namespace
}  // namespace fedwan::metrics
