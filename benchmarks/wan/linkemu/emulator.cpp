#include "emulator.hpp"

#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <queue>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "common/errno_text.hpp"
#include "tun_netns.hpp"

namespace fedwan::linkemu {
namespace {

constexpr size_t kPacketBuffer = 65536;  // a TUN read returns one packet of at most the MTU
constexpr int kReadBatch = 256;  // packets read from one device before the others get a turn

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

double number(const nlohmann::json& j, const char* key, double lo, double hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number()) throw std::invalid_argument(std::string(key) + " must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    throw std::invalid_argument(std::string(key) + " = " + v.dump() + " is outside [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return x;
}

void apply_profile_keys(const nlohmann::json& j, LinkProfile* p) {
  if (!j.is_object()) throw std::invalid_argument("a link profile must be an object");
  static const std::set<std::string> known = {"rate_mbit",        "delay_ms",        "jitter_ms",
                                              "loss_percent",     "reorder_percent", "queue_kb",
                                              "duplicate_percent"};
  for (const auto& [key, value] : j.items()) {
    if (known.count(key) == 0)
      throw std::invalid_argument("unknown link profile key '" + key + "'");
  }
  if (j.contains("rate_mbit")) p->rate_bps = number(j, "rate_mbit", 0, 1e6) * 1e6;
  if (j.contains("delay_ms")) p->delay_s = number(j, "delay_ms", 0, 10000) / 1e3;
  if (j.contains("jitter_ms")) p->jitter_s = number(j, "jitter_ms", 0, 10000) / 1e3;
  if (j.contains("loss_percent")) p->loss = number(j, "loss_percent", 0, 99.999) / 100;
  if (j.contains("duplicate_percent")) {
    p->duplicate = number(j, "duplicate_percent", 0, 99.999) / 100;
  }
  if (j.contains("reorder_percent")) p->reorder = number(j, "reorder_percent", 0, 99.999) / 100;
  if (j.contains("queue_kb")) {
    p->queue_bytes = static_cast<uint64_t>(number(j, "queue_kb", 0, 4 << 20) * 1000);
  }
}

LinkProfile checked(LinkProfile p, const std::string& where) {
  const std::string why = p.invalid_reason();
  if (!why.empty()) throw std::invalid_argument(where + ": " + why);
  return p;
}

nlohmann::json counters_to_json(const DirectionCounters& c) {
  return {{"packets", c.packets},
          {"bytes", c.bytes},
          {"tcp_payload_bytes", c.tcp_payload},
          {"tcp_retransmitted_bytes", c.tcp_retransmitted},
          {"tcp_new_payload_bytes", c.tcp_payload - c.tcp_retransmitted},
          {"lost_packets", c.lost},
          {"lost_bytes", c.lost_bytes},
          {"queue_drop_packets", c.queue_drops},
          {"queue_drop_bytes", c.queue_drop_bytes},
          {"duplicated_packets", c.duplicated},
          {"reordered_packets", c.reordered}};
}

struct Packet {
  uint32_t len = 0;
  int to = -1;       // destination host
  int route = -1;    // index into Impl::routes: the link directions it crosses
  uint32_t hop = 0;  // the one it is crossing now
  uint8_t data[kPacketBuffer];
};

struct Event {
  int64_t at;
  uint64_t order;  // ties leave in the order they were scheduled
  Packet* packet;
  bool operator>(const Event& o) const { return at != o.at ? at > o.at : order > o.order; }
};

struct Link {
  int a, b;
  LinkDirection dir[2];  // [0]: a -> b, [1]: b -> a
  PacketStats stats[2];
};

// Owns every packet buffer; freed ones are reused.
class PacketPool {
 public:
  Packet* get() {
    if (free_.empty()) {
      all_.push_back(std::make_unique<Packet>());
      return all_.back().get();
    }
    Packet* p = free_.back();
    free_.pop_back();
    return p;
  }
  void put(Packet* p) { free_.push_back(p); }

 private:
  std::vector<std::unique_ptr<Packet>> all_;
  std::vector<Packet*> free_;
};

// The "paths" of a configuration: hosts known, each hop a link, the ends
// without a link of their own, each pair of ends once.
void read_paths(const nlohmann::json& paths, const std::set<std::string>& names,
                const std::set<std::pair<std::string, std::string>>& links, EmulatorConfig* c) {
  if (!paths.is_array()) throw std::invalid_argument("paths must be a list");
  std::set<std::pair<std::string, std::string>> ends;
  for (const nlohmann::json& p : paths) {
    PathConfig path;
    path.from = p.at("from").get<std::string>();
    path.to = p.at("to").get<std::string>();
    const std::string where = "path " + path.from + " -> " + path.to;
    for (const auto& [key, value] : p.items()) {
      if (key != "from" && key != "to" && key != "via") {
        throw std::invalid_argument(where + ": unknown key '" + key + "'");
      }
    }
    path.via = p.at("via").get<std::vector<std::string>>();
    if (path.via.empty()) throw std::invalid_argument(where + ": via names no host");
    std::vector<std::string> hops = {path.from};
    hops.insert(hops.end(), path.via.begin(), path.via.end());
    hops.push_back(path.to);
    std::set<std::string> seen;
    for (const std::string& h : hops) {
      if (names.count(h) == 0) throw std::invalid_argument(where + ": no host '" + h + "'");
      if (!seen.insert(h).second) throw std::invalid_argument(where + ": visits '" + h + "' twice");
    }
    for (size_t k = 0; k + 1 < hops.size(); ++k) {
      if (links.count(std::minmax(hops[k], hops[k + 1])) == 0) {
        throw std::invalid_argument(where + ": no link " + hops[k] + " <-> " + hops[k + 1]);
      }
    }
    if (links.count(std::minmax(path.from, path.to)) != 0) {
      throw std::invalid_argument(where + ": the two hosts have a link of their own");
    }
    if (!ends.insert(std::minmax(path.from, path.to)).second) {
      throw std::invalid_argument(where + " is listed twice (each path serves both directions)");
    }
    c->paths.push_back(std::move(path));
  }
}

}  // namespace

LinkProfile profile_from_json(const nlohmann::json& j) {
  LinkProfile p;
  apply_profile_keys(j, &p);
  return checked(p, "link profile");
}

nlohmann::json profile_to_json(const LinkProfile& p) {
  return {{"rate_mbit", p.rate_bps / 1e6},
          {"delay_ms", p.delay_s * 1e3},
          {"jitter_ms", p.jitter_s * 1e3},
          {"loss_percent", p.loss * 100},
          {"duplicate_percent", p.duplicate * 100},
          {"reorder_percent", p.reorder * 100},
          {"queue_kb", static_cast<double>(p.effective_queue_bytes()) / 1000}};
}

EmulatorConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("the configuration must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "hosts" && key != "links" && key != "paths" && key != "prefix_len" && key != "mtu" &&
        key != "seed") {
      throw std::invalid_argument("unknown configuration key '" + key + "'");
    }
  }
  EmulatorConfig c;
  if (j.contains("prefix_len")) c.prefix_len = static_cast<int>(number(j, "prefix_len", 8, 30));
  if (j.contains("mtu")) c.mtu = static_cast<int>(number(j, "mtu", 576, 9000));
  if (j.contains("seed")) c.seed = j.at("seed").get<uint64_t>();
  std::set<std::string> names;
  std::set<uint32_t> addresses;
  for (const nlohmann::json& h : j.at("hosts")) {
    HostConfig host{h.at("name").get<std::string>(), h.at("netns").get<std::string>(),
                    h.at("address").get<std::string>()};
    if (!names.insert(host.name).second) {
      throw std::invalid_argument("host '" + host.name + "' is listed twice");
    }
    if (!addresses.insert(parse_ipv4(host.address)).second) {
      throw std::invalid_argument("address " + host.address + " is used twice");
    }
    c.hosts.push_back(host);
  }
  if (c.hosts.size() < 2) throw std::invalid_argument("an emulation needs at least two hosts");
  std::set<std::pair<std::string, std::string>> pairs;
  for (const nlohmann::json& l : j.at("links")) {
    LinkConfig link;
    link.a = l.at("a").get<std::string>();
    link.b = l.at("b").get<std::string>();
    const std::string where = "link " + link.a + " <-> " + link.b;
    for (const std::string& end : {link.a, link.b}) {
      if (names.count(end) == 0) throw std::invalid_argument(where + ": no host '" + end + "'");
    }
    if (link.a == link.b) throw std::invalid_argument(where + ": a link joins two hosts");
    if (!pairs.insert(std::minmax(link.a, link.b)).second) {
      throw std::invalid_argument(where + " is listed twice");
    }
    for (const auto& [key, value] : l.items()) {
      if (key != "a" && key != "b" && key != "profile" && key != "a_to_b" && key != "b_to_a") {
        throw std::invalid_argument(where + ": unknown key '" + key + "'");
      }
    }
    LinkProfile both;
    if (l.contains("profile")) apply_profile_keys(l.at("profile"), &both);
    link.a_to_b = both;
    link.b_to_a = both;
    if (l.contains("a_to_b")) apply_profile_keys(l.at("a_to_b"), &link.a_to_b);
    if (l.contains("b_to_a")) apply_profile_keys(l.at("b_to_a"), &link.b_to_a);
    link.a_to_b = checked(link.a_to_b, where + " (" + link.a + " -> " + link.b + ")");
    link.b_to_a = checked(link.b_to_a, where + " (" + link.b + " -> " + link.a + ")");
    c.links.push_back(link);
  }
  if (j.contains("paths")) read_paths(j.at("paths"), names, pairs, &c);
  return c;
}

struct Emulator::Impl {
  EmulatorConfig config;
  std::vector<std::unique_ptr<TunDevice>> tuns;
  std::unordered_map<uint32_t, int> host_by_address;
  std::vector<Link> links;
  // [from * hosts + to] = index into routes, or -1; a route lists the link
  // directions (link * 2 + direction) a packet crosses, in order.
  std::vector<int> route;
  std::vector<std::vector<int>> routes;
  PacketPool pool;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> due;
  uint64_t order = 0;
  uint64_t unrouted = 0;
  uint64_t write_errors = 0;
  int64_t started_ns = now_ns();
  int64_t armed_ns = -1;

  int hosts() const { return static_cast<int>(config.hosts.size()); }
  void forward(int from, Packet* p);
  // Admits p (whose header `info` is) to the link of its current hop.
  void cross(Packet* p, int64_t now, const PacketInfo& info);
  void drain(int host);
  void deliver_until(int64_t now);
  void rearm(int timer_fd);
};

Emulator::Emulator(const EmulatorConfig& config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.config = config;
  std::unordered_map<std::string, int> index;
  for (const HostConfig& h : config.hosts) {
    index[h.name] = static_cast<int>(m.tuns.size());
    TunSpec spec;
    spec.netns = h.netns;
    spec.address = h.address;
    spec.prefix_len = config.prefix_len;
    spec.mtu = config.mtu;
    m.host_by_address[parse_ipv4(h.address)] = static_cast<int>(m.tuns.size());
    m.tuns.push_back(std::make_unique<TunDevice>(spec));
  }
  m.route.assign(static_cast<size_t>(m.hosts()) * m.hosts(), -1);
  uint64_t seed = config.seed;
  for (const LinkConfig& l : config.links) {
    const int a = index.at(l.a);
    const int b = index.at(l.b);
    m.links.push_back(
        Link{a, b, {LinkDirection(l.a_to_b, seed), LinkDirection(l.b_to_a, seed + 1)}, {}});
    seed += 2;
    const int k = static_cast<int>(m.links.size()) - 1;
    m.routes.push_back({2 * k});
    m.route[static_cast<size_t>(a) * m.hosts() + b] = static_cast<int>(m.routes.size()) - 1;
    m.routes.push_back({2 * k + 1});
    m.route[static_cast<size_t>(b) * m.hosts() + a] = static_cast<int>(m.routes.size()) - 1;
  }
  for (const PathConfig& path : config.paths) {
    std::vector<int> hosts = {index.at(path.from)};
    for (const std::string& v : path.via) hosts.push_back(index.at(v));
    hosts.push_back(index.at(path.to));
    std::vector<int> forward, backward;
    for (size_t k = 0; k + 1 < hosts.size(); ++k) {
      forward.push_back(m.routes[static_cast<size_t>(
          m.route[static_cast<size_t>(hosts[k]) * m.hosts() + hosts[k + 1]])][0]);
    }
    for (size_t k = hosts.size() - 1; k > 0; --k) {
      backward.push_back(m.routes[static_cast<size_t>(
          m.route[static_cast<size_t>(hosts[k]) * m.hosts() + hosts[k - 1]])][0]);
    }
    m.routes.push_back(std::move(forward));
    m.route[static_cast<size_t>(hosts.front()) * m.hosts() + hosts.back()] =
        static_cast<int>(m.routes.size()) - 1;
    m.routes.push_back(std::move(backward));
    m.route[static_cast<size_t>(hosts.back()) * m.hosts() + hosts.front()] =
        static_cast<int>(m.routes.size()) - 1;
  }
}

Emulator::~Emulator() = default;

void Emulator::Impl::forward(int from, Packet* p) {
  PacketInfo info;
  auto it = PacketInfo::parse(p->data, p->len, &info) ? host_by_address.find(info.dst)
                                                      : host_by_address.end();
  const int r =
      it == host_by_address.end() ? -1 : route[static_cast<size_t>(from) * hosts() + it->second];
  if (r < 0) {
    ++unrouted;
    pool.put(p);
    return;
  }
  p->to = it->second;
  p->route = r;
  p->hop = 0;
  cross(p, now_ns(), info);
}

void Emulator::Impl::cross(Packet* p, int64_t now, const PacketInfo& info) {
  const int r = routes[static_cast<size_t>(p->route)][p->hop];
  Link& link = links[static_cast<size_t>(r / 2)];
  const int d = r % 2;
  PacketStats& stats = link.stats[d];
  stats.offered(info, p->len);
  const Verdict v = link.dir[d].admit(now, p->len);
  DirectionCounters& c = stats.counters();
  if (v.fate == Verdict::Fate::kLost) {
    ++c.lost;
    c.lost_bytes += p->len;
    pool.put(p);
    return;
  }
  if (v.fate == Verdict::Fate::kQueueFull) {
    ++c.queue_drops;
    c.queue_drop_bytes += p->len;
    pool.put(p);
    return;
  }
  if (v.reordered) ++c.reordered;
  due.push(Event{v.deliver_ns[0], order++, p});
  if (v.copies == 2) {
    ++c.duplicated;
    Packet* copy = pool.get();
    copy->len = p->len;
    copy->to = p->to;
    copy->route = p->route;
    copy->hop = p->hop;
    std::copy(p->data, p->data + p->len, copy->data);
    due.push(Event{v.deliver_ns[1], order++, copy});
  }
}

void Emulator::Impl::drain(int host) {
  const int fd = tuns[static_cast<size_t>(host)]->fd();
  for (int k = 0; k < kReadBatch; ++k) {
    Packet* p = pool.get();
    const ssize_t n = ::read(fd, p->data, sizeof p->data);
    if (n <= 0) {
      pool.put(p);
      return;  // EAGAIN: drained
    }
    p->len = static_cast<uint32_t>(n);
    forward(host, p);
  }
}

void Emulator::Impl::deliver_until(int64_t now) {
  while (!due.empty() && due.top().at <= now) {
    Packet* p = due.top().packet;
    due.pop();
    if (p->hop + 1 < routes[static_cast<size_t>(p->route)].size()) {
      // Across a relaying host: on to the next link (as its own traffic is).
      ++p->hop;
      PacketInfo info;
      (void)PacketInfo::parse(p->data, p->len, &info);
      cross(p, now, info);
      continue;
    }
    if (::write(tuns[static_cast<size_t>(p->to)]->fd(), p->data, p->len) < 0) ++write_errors;
    pool.put(p);
  }
}

void Emulator::Impl::rearm(int timer_fd) {
  const int64_t next = due.empty() ? 0 : due.top().at;
  if (next == armed_ns) return;
  itimerspec t{};
  t.it_value.tv_sec = next / 1'000'000'000;
  t.it_value.tv_nsec = next % 1'000'000'000;
  ::timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &t, nullptr);  // 0: disarmed
  armed_ns = next;
}

nlohmann::json Emulator::stats() const {
  const Impl& m = *impl_;
  nlohmann::json links = nlohmann::json::array();
  for (const Link& l : m.links) {
    const std::string& a = m.config.hosts[static_cast<size_t>(l.a)].name;
    const std::string& b = m.config.hosts[static_cast<size_t>(l.b)].name;
    links.push_back({{"a", a},
                     {"b", b},
                     {"a_to_b",
                      {{"profile", profile_to_json(l.dir[0].profile())},
                       {"counters", counters_to_json(l.stats[0].counters())}}},
                     {"b_to_a",
                      {{"profile", profile_to_json(l.dir[1].profile())},
                       {"counters", counters_to_json(l.stats[1].counters())}}}});
  }
  return {{"shaping", "fedwan-linkemu"},
          {"elapsed_s", static_cast<double>(now_ns() - m.started_ns) / 1e9},
          {"unrouted_packets", m.unrouted},
          {"write_errors", m.write_errors},
          {"links", links}};
}

namespace {

void write_stats(const nlohmann::json& j, const std::string& path) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + tmp + ": " + errno_text(errno));
  }
}

// Closes a descriptor on scope exit.
struct OwnedFd {
  int fd;
  ~OwnedFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void Emulator::run(const std::string& stats_path) {
  Impl& m = *impl_;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  if (::sigprocmask(SIG_BLOCK, &signals, nullptr) != 0) {
    throw std::runtime_error("sigprocmask: " + errno_text(errno));
  }
  const OwnedFd sig{::signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC)};
  const OwnedFd timer{::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)};
  const OwnedFd ep{::epoll_create1(EPOLL_CLOEXEC)};
  if (sig.fd < 0 || timer.fd < 0 || ep.fd < 0) {
    throw std::runtime_error("signalfd/timerfd/epoll: " + errno_text(errno));
  }
  const auto watch = [&](int fd, uint64_t tag) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = tag;
    if (::epoll_ctl(ep.fd, EPOLL_CTL_ADD, fd, &e) != 0) {
      throw std::runtime_error("epoll_ctl: " + errno_text(errno));
    }
  };
  constexpr uint64_t kTimer = ~uint64_t{0};
  constexpr uint64_t kSignal = kTimer - 1;
  for (int h = 0; h < m.hosts(); ++h)
    watch(m.tuns[static_cast<size_t>(h)]->fd(), static_cast<uint64_t>(h));
  watch(timer.fd, kTimer);
  watch(sig.fd, kSignal);

  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(ep.fd, events, 64, -1);
    if (n < 0 && errno != EINTR) throw std::runtime_error("epoll_wait: " + errno_text(errno));
    for (int k = 0; k < n; ++k) {
      const uint64_t tag = events[k].data.u64;
      if (tag == kTimer) {
        uint64_t expirations = 0;
        (void)::read(timer.fd, &expirations, sizeof expirations);
        m.armed_ns = -1;
      } else if (tag == kSignal) {
        signalfd_siginfo info{};
        while (::read(sig.fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
          if (info.ssi_signo == SIGUSR1) {
            write_stats(stats(), stats_path);
          } else {
            write_stats(stats(), stats_path);
            return;
          }
        }
      } else {
        m.drain(static_cast<int>(tag));
      }
    }
    m.deliver_until(now_ns());
    m.rearm(timer.fd);
  }
}

}  // namespace fedwan::linkemu
