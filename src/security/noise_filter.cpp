#include "security/noise_filter.hpp"

#include <algorithm>

namespace fedwan::security {

NoiseFilter::NoiseFilter(Options options) : options_(options) {
  options_.burst = std::max<uint32_t>(options_.burst, 1);
  options_.max_keys = std::max<size_t>(options_.max_keys, 1);
  if (options_.window.count() <= 0) options_.window = std::chrono::milliseconds(1);
}

bool NoiseFilter::admit(std::string_view key, Clock::time_point now, uint64_t bytes) {
  auto it = keys_.find(std::string(key));
  if (it == keys_.end()) {
    if (keys_.size() >= options_.max_keys) {
      // Forget what is idle first (its summaries wait for drain()); only
      // then fall back to the shared key.
      collect(now, /*all=*/false, &ended_);
      if (keys_.size() >= options_.max_keys) key = kOverflowKey;
    }
    if (it == keys_.end()) it = keys_.try_emplace(std::string(key), Window{now}).first;
  }
  Window& w = it->second;
  if (now - w.start >= options_.window) {
    if (w.suppressed > 0) ended_.push_back({it->first, w.suppressed, w.bytes, options_.window});
    w = Window{now};
  }
  if (w.written < options_.burst) {
    ++w.written;
    return true;
  }
  ++w.suppressed;
  w.bytes += bytes;
  return false;
}

std::vector<NoiseFilter::Summary> NoiseFilter::drain(Clock::time_point now, bool all) {
  std::vector<Summary> out = std::move(ended_);
  ended_.clear();
  collect(now, all, &out);
  return out;
}

void NoiseFilter::collect(Clock::time_point now, bool all, std::vector<Summary>* out) {
  for (auto it = keys_.begin(); it != keys_.end();) {
    Window& w = it->second;
    const bool ended = now - w.start >= options_.window;
    if ((ended || all) && w.suppressed > 0) {
      out->push_back({it->first, w.suppressed, w.bytes, options_.window});
      w.suppressed = 0;
      w.bytes = 0;
    }
    if (ended) {
      it = keys_.erase(it);  // idle: a new occurrence starts a new window
    } else {
      ++it;
    }
  }
}

std::string noise_key(std::string_view event, std::string_view text) {
  std::string key(event);
  key += ':';
  char quote = 0;
  bool digits = false;
  for (char c : text) {
    if (key.size() >= event.size() + 1 + 80) break;
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      key += "...";
      digits = false;
      continue;
    }
    if (c >= '0' && c <= '9') {
      if (!digits) key += '#';
      digits = true;
      continue;
    }
    digits = false;
    key += c;
  }
  return key;
}

}  // namespace fedwan::security
