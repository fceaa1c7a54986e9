#include "tun_netns.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/errno_text.hpp"

namespace fedwan::linkemu {
namespace {

std::string sys_error(const std::string& what) { return what + ": " + errno_text(errno); }

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

// Enters a namespace for the lifetime of the object and returns to the
// one the thread was in.
class InNamespace {
 public:
  explicit InNamespace(const std::string& netns) : home_(::open("/proc/self/ns/net", O_RDONLY)) {
    if (home_.fd < 0) throw std::runtime_error(sys_error("open /proc/self/ns/net"));
    const std::string path = netns.rfind('/', 0) == 0 ? netns : "/var/run/netns/" + netns;
    Fd target(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (target.fd < 0) throw std::runtime_error(sys_error("network namespace " + path));
    if (::setns(target.fd, CLONE_NEWNET) != 0) {
      throw std::runtime_error(sys_error("setns into " + path));
    }
  }
  ~InNamespace() { (void)::setns(home_.fd, CLONE_NEWNET); }
  InNamespace(const InNamespace&) = delete;
  InNamespace& operator=(const InNamespace&) = delete;

 private:
  Fd home_;
};

void set_name(ifreq* r, const std::string& device) {
  std::memset(r, 0, sizeof *r);
  std::strncpy(r->ifr_name, device.c_str(), IFNAMSIZ - 1);
}

void ifioctl(int sock, unsigned long request, ifreq* r, const std::string& what) {
  if (::ioctl(sock, request, r) != 0) throw std::runtime_error(sys_error(what));
}

void set_address(int sock, const std::string& device, unsigned long request, uint32_t addr,
                 const std::string& what) {
  ifreq r;
  set_name(&r, device);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(addr);
  std::memcpy(&r.ifr_addr, &sin, sizeof sin);
  ifioctl(sock, request, &r, what);
}

void bring_up(int sock, const std::string& device) {
  ifreq r;
  set_name(&r, device);
  ifioctl(sock, SIOCGIFFLAGS, &r, "read flags of " + device);
  r.ifr_flags = static_cast<short>(r.ifr_flags | IFF_UP | IFF_RUNNING);
  ifioctl(sock, SIOCSIFFLAGS, &r, "bring up " + device);
}

}  // namespace

uint32_t parse_ipv4(const std::string& text) {
  in_addr a{};
  if (::inet_pton(AF_INET, text.c_str(), &a) != 1) {
    throw std::invalid_argument("not a dotted IPv4 address: '" + text + "'");
  }
  return ntohl(a.s_addr);
}

TunDevice::TunDevice(const TunSpec& spec) {
  const std::string where = "device " + spec.device + " in namespace " + spec.netns;
  if (spec.device.empty() || spec.device.size() >= IFNAMSIZ) {
    throw std::runtime_error("bad device name '" + spec.device + "'");
  }
  const uint32_t addr = parse_ipv4(spec.address);
  if (spec.prefix_len < 8 || spec.prefix_len > 30) {
    throw std::runtime_error("prefix length must be 8 to 30");
  }
  InNamespace inside(spec.netns);
  Fd tun(::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (tun.fd < 0) throw std::runtime_error(sys_error("open /dev/net/tun"));
  ifreq r;
  set_name(&r, spec.device);
  r.ifr_flags = IFF_TUN | IFF_NO_PI;
  ifioctl(tun.fd, TUNSETIFF, &r, "create TUN " + where);

  Fd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (sock.fd < 0) throw std::runtime_error(sys_error("socket in namespace " + spec.netns));
  set_address(sock.fd, spec.device, SIOCSIFADDR, addr, "set the address of " + where);
  const uint32_t mask = ~uint32_t{0} << (32 - spec.prefix_len);
  set_address(sock.fd, spec.device, SIOCSIFNETMASK, mask, "set the netmask of " + where);
  set_name(&r, spec.device);
  r.ifr_mtu = spec.mtu;
  ifioctl(sock.fd, SIOCSIFMTU, &r, "set the MTU of " + where);
  set_name(&r, spec.device);
  r.ifr_qlen = spec.txqueuelen;
  ifioctl(sock.fd, SIOCSIFTXQLEN, &r, "set the queue length of " + where);
  bring_up(sock.fd, spec.device);
  bring_up(sock.fd, "lo");
  fd_ = tun.release();
}

TunDevice::~TunDevice() {
  if (fd_ >= 0) ::close(fd_);
}

std::string tun_unavailable_reason() {
  if (::geteuid() != 0) return "needs root (CAP_NET_ADMIN) to create TUN devices";
  if (::access("/dev/net/tun", R_OK | W_OK) != 0) return "no /dev/net/tun";
  return {};
}

}  // namespace fedwan::linkemu
