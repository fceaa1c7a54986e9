// What the links' transport costs a byte, before fedwan does anything with
// it: one chunk's fp16 frame after another from one ZeroMQ context to
// another (each its own I/O thread, as two nodes have) over TCP on
// loopback, sent without a copy and received into the message ZeroMQ
// allocates, as the links do. The time is the process's CPU time, every
// thread together (the sender's, the receiver's, both I/O threads and the
// kernel's work for them), so bytes_per_second is bytes per CPU-second of
// one link's both ends: what benchmarks/python/pipeline_cpu.py sets beside
// a federation's figure as the floor its links put under it.
// Names follow BM_Transport_<what>/<fp32 chunk bytes>, as BM_Seal_*.
#include <benchmark/benchmark.h>

#include <zmq.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kBatchBytes = 64 * kMiB;  // received each iteration

void no_free(void* /*data*/, void* /*hint*/) {}

void BM_Transport_Loopback(benchmark::State& state) {
  // A chunk of n fp32 bytes goes as an fp16 frame of about half as many.
  const size_t frame_bytes = static_cast<size_t>(state.range(0)) / 2 + 64;
  const int64_t per_batch = kBatchBytes / static_cast<int64_t>(frame_bytes);
  // Outlives both contexts: their I/O threads write from it until the
  // contexts end.
  const std::vector<uint8_t> frame(frame_bytes, 0x5a);
  zmq::context_t sender_ctx(1);
  zmq::context_t receiver_ctx(1);
  zmq::socket_t pull(receiver_ctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::linger, 0);
  pull.bind("tcp://127.0.0.1:*");
  const std::string endpoint = pull.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    zmq::socket_t push(sender_ctx, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, 0);
    push.set(zmq::sockopt::sndhwm, 8);
    push.set(zmq::sockopt::sndtimeo, 50);
    push.connect(endpoint);
    while (!stop.load(std::memory_order_relaxed)) {
      zmq::message_t m(const_cast<uint8_t*>(frame.data()), frame.size(), no_free, nullptr);
      (void)push.send(m, zmq::send_flags::none);  // false: timed out, try again
    }
  });
  zmq::message_t in;
  for (int i = 0; i < 4; ++i) (void)pull.recv(in);  // connected and moving
  for (auto _ : state) {
    for (int64_t i = 0; i < per_batch; ++i) {
      if (!pull.recv(in)) state.SkipWithError("receive failed");
    }
  }
  stop.store(true);
  sender.join();
  state.SetBytesProcessed(state.iterations() * per_batch * static_cast<int64_t>(frame_bytes));
}

}  // namespace

BENCHMARK(BM_Transport_Loopback)->Arg(kMiB)->Arg(4 * kMiB)->MeasureProcessCPUTime();
