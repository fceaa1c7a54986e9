// The Renyi accountant of fedwan/privacy.hpp.
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "fedwan/error.hpp"
#include "fedwan/privacy.hpp"

namespace fedwan {
namespace {

std::vector<double> default_orders() {
  std::vector<double> o;
  for (int x = 1; x < 100; ++x) o.push_back(1 + x / 10.0);
  for (int x = 11; x < 64; ++x) o.push_back(x);
  for (double x : {128.0, 256.0, 512.0, 1024.0}) o.push_back(x);
  return o;
}

void check_delta(double delta) {
  if (!(delta > 0 && delta < 1)) {
    throw ConfigError("privacy: delta must be in (0, 1), got " + std::to_string(delta));
  }
}

}  // namespace

PrivacyAccountant::PrivacyAccountant() : PrivacyAccountant(default_orders()) {}

PrivacyAccountant::PrivacyAccountant(std::vector<double> orders)
    : orders_(std::move(orders)), rdp_(orders_.size(), 0.0) {
  for (double a : orders_) {
    if (!(a > 1) || !std::isfinite(a)) {
      throw ConfigError("privacy accountant: a Renyi order must be finite and > 1");
    }
  }
}

void PrivacyAccountant::compose_gaussian(double noise_multiplier, uint64_t count) {
  if (!(noise_multiplier > 0) || !std::isfinite(noise_multiplier)) {
    throw ConfigError("privacy: the noise multiplier must be finite and > 0, got " +
                      std::to_string(noise_multiplier));
  }
  const double per = static_cast<double>(count) / (2 * noise_multiplier * noise_multiplier);
  for (size_t i = 0; i < orders_.size(); ++i) rdp_[i] += orders_[i] * per;
  rounds_ += count;
}

PrivacyLoss PrivacyAccountant::loss(double delta) const {
  check_delta(delta);
  PrivacyLoss best{std::numeric_limits<double>::infinity(), delta, 0};
  for (size_t i = 0; i < orders_.size(); ++i) {
    const double a = orders_[i];
    const double r = rdp_[i];
    double eps = std::numeric_limits<double>::infinity();
    if (delta * delta + std::expm1(-r) > 0) {
      eps = 0;  // bounded through the KL divergence: delta <= sqrt(1 - exp(-KL))
    } else if (a > 1.01) {
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    }
    if (eps < best.epsilon) best = PrivacyLoss{eps, delta, a};
  }
  if (best.epsilon < 0) best.epsilon = 0;
  return best;
}

double gaussian_epsilon(double noise_multiplier, uint64_t rounds, double delta) {
  PrivacyAccountant a;
  if (rounds == 0) return 0;
  a.compose_gaussian(noise_multiplier, rounds);
  return a.loss(delta).epsilon;
}

double noise_multiplier_for(double epsilon, double delta, uint64_t rounds) {
  check_delta(delta);
  if (!(epsilon > 0) || !std::isfinite(epsilon) || rounds == 0) {
    throw ConfigError("privacy: a target epsilon must be finite and > 0 over at least one round");
  }
  // Epsilon falls as z grows: bisect on log z.
  double lo = 1e-3;
  double hi = 1e6;
  if (gaussian_epsilon(hi, rounds, delta) > epsilon) {
    throw ConfigError("privacy: epsilon " + std::to_string(epsilon) + " over " +
                      std::to_string(rounds) + " rounds needs a noise multiplier above 1e6");
  }
  if (gaussian_epsilon(lo, rounds, delta) <= epsilon) return lo;
  while (hi / lo > 1 + 1e-7) {
    const double mid = std::sqrt(lo * hi);
    if (gaussian_epsilon(mid, rounds, delta) <= epsilon) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

uint64_t rounds_within(double epsilon, double delta, double noise_multiplier) {
  check_delta(delta);
  // Epsilon grows with the rounds: find the last that stays within, by
  // doubling then bisecting.
  if (gaussian_epsilon(noise_multiplier, 1, delta) > epsilon) return 0;
  uint64_t lo = 1;
  uint64_t hi = 2;
  while (gaussian_epsilon(noise_multiplier, hi, delta) <= epsilon) {
    lo = hi;
    if (hi > (uint64_t{1} << 40)) return hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (gaussian_epsilon(noise_multiplier, mid, delta) <= epsilon) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace fedwan
