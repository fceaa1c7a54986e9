#include "transport/crypto_workers.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "fedwan/error.hpp"
#include "security/aead.hpp"

namespace fedwan::transport {

CryptoWorkers::CryptoWorkers(size_t threads) {
  if (threads == 0) throw ConfigError("CryptoWorkers: at least one thread");
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

CryptoWorkers::~CryptoWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void CryptoWorkers::submit(Job* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->done_ = false;
    queued_.push_back(job);
  }
  wake_.notify_one();
}

void CryptoWorkers::run_parts(size_t parts, const std::function<void(size_t)>& fn) {
  if (parts == 0) return;
  std::vector<Job> jobs(parts - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // At the queue's front, part 1 first.
    for (size_t k = parts - 1; k > 0; --k) {
      Job& job = jobs[k - 1];
      job.task = [&fn, k] { fn(k); };
      job.done_ = false;
      queued_.push_front(&job);
    }
  }
  wake_.notify_all();
  std::vector<std::exception_ptr> errors(parts);
  try {
    fn(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (size_t k = 1; k < parts; ++k) {
    Job& job = jobs[k - 1];
    std::unique_lock<std::mutex> lock(mu_);
    const auto queued = std::find(queued_.begin(), queued_.end(), &job);
    if (queued != queued_.end()) {  // no thread took it: this one does
      queued_.erase(queued);
      lock.unlock();
      try {
        fn(k);
      } catch (...) {
        errors[k] = std::current_exception();
      }
      continue;
    }
    ran_.wait(lock, [&] { return job.done_; });
    errors[k] = job.error;
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

bool CryptoWorkers::wait(const Job* job, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return ran_.wait_for(lock, timeout, [&] { return job->done_; });
}

bool CryptoWorkers::done(const Job* job) const {
  std::lock_guard<std::mutex> lock(mu_);
  return job->done_;
}

size_t CryptoWorkers::default_threads() {
  if (const char* env = std::getenv("FEDWAN_CRYPTO_THREADS"); env != nullptr && *env != '\0') {
    const std::string v = env;
    const bool number = v.size() <= 2 && v.find_first_not_of("0123456789") == std::string::npos;
    if (!number || std::stoul(v) > kMaxThreads) {
      throw ConfigError("FEDWAN_CRYPTO_THREADS=" + v + ": a number of threads from 0 to " +
                        std::to_string(kMaxThreads) + " (0: frames are sealed and opened on " +
                        "the link's own thread); unset, one fewer than the cores, at most 3");
    }
    return std::stoul(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  size_t cores = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = size_t(CPU_COUNT(&set));
  return std::min<size_t>(3, cores > 0 ? cores - 1 : 0);
}

std::any CryptoWorkers::inspect(const Job& job) {
  if (job.inspect == nullptr || !*job.inspect) return {};
  try {
    return (*job.inspect)(job.data, job.frame->opened_size());
  } catch (...) {
    return {};  // the owner works it out itself, and meets what failed there
  }
}

void CryptoWorkers::work() {
  // Named, so that top -H and /proc show where a link's opening goes.
  pthread_setname_np(pthread_self(), "fedwan-crypto");
  std::unique_ptr<security::AeadCipher> cipher;  // this thread's own
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queued_.empty(); });
    if (stop_) return;
    Job* job = queued_.front();
    queued_.pop_front();
    lock.unlock();
    bool ok = false;
    std::exception_ptr error;
    try {
      if (job->task) {
        job->task();
      } else {
        ok = job->frame->run(job->data, &cipher);
      }
    } catch (...) {
      error = std::current_exception();
      cipher.reset();  // its state after a library failure is unknown
    }
    std::any inspected = ok ? inspect(*job) : std::any();
    lock.lock();
    job->authenticated = ok;
    job->inspected = std::move(inspected);
    job->error = error;
    job->done_ = true;
    ran_.notify_all();
  }
}

}  // namespace fedwan::transport
