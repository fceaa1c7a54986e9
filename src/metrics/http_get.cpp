#include "metrics/http_get.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/errno_text.hpp"

namespace fedwan::metrics {
namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(left.count());
}

// Waits for `events` on fd until the deadline; false on timeout or error.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// "host:port" or "[v6]:port"; a wildcard listen address means this
// machine. False unless a host comes before the last ':'.
bool split_address(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  if (*host == "0.0.0.0" || *host == "*") *host = "127.0.0.1";
  if (*host == "::") *host = "::1";
  return true;
}

// Connects `sock` (non-blocking) to the first of host's addresses that
// answers by the deadline; false with `*error` set.
bool connect_to(const std::string& address, const std::string& host, const std::string& port,
                Clock::time_point deadline, Fd* sock, std::string* error) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *error = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return false;
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && sock->fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
        (errno == EINPROGRESS && wait_for(fd, POLLOUT, deadline))) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        sock->fd = fd;
        break;
      }
      why = errno_text(err);
    } else {
      why = ms_left(deadline) == 0 ? "timed out" : errno_text(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (sock->fd < 0) {
    *error = "no answer at " + address + " (" + why + ")";
    return false;
  }
  return true;
}

bool send_all(int fd, const std::string& request, const std::string& address,
              Clock::time_point deadline, std::string* error) {
  size_t off = 0;
  while (off < request.size()) {
    const ssize_t n = ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline)) {
        *error = "timed out sending to " + address;
        return false;
      }
    } else {
      *error = "send to " + address + " failed: " + errno_text(errno);
      return false;
    }
  }
  return true;
}

// Reads into `raw` until the peer closes (Connection: close ends the answer).
bool read_all(int fd, const std::string& address, size_t max_bytes, Clock::time_point deadline,
              std::string* raw, std::string* error) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      raw->append(buf, static_cast<size_t>(n));
      if (raw->size() > max_bytes) {
        *error = "answer from " + address + " larger than " + std::to_string(max_bytes) + " bytes";
        return false;
      }
    } else if (n == 0) {
      return true;
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!wait_for(fd, POLLIN, deadline)) {
        *error = "timed out reading from " + address;
        return false;
      }
    } else {
      *error = "read from " + address + " failed: " + errno_text(errno);
      return false;
    }
  }
}

}  // namespace

HttpResponse http_get(const std::string& address, const std::string& path,
                      std::chrono::milliseconds timeout, size_t max_bytes,
                      const std::string& bearer_token) {
  HttpResponse out;
  const auto deadline = Clock::now() + timeout;
  std::string host, port;
  if (!split_address(address, &host, &port)) {
    out.error = "'" + address + "' is not host:port";
    return out;
  }
  Fd sock;
  if (!connect_to(address, host, port, deadline, &sock, &out.error)) return out;
  std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\nConnection: close\r\nAccept: */*\r\n";
  if (!bearer_token.empty()) request += "Authorization: Bearer " + bearer_token + "\r\n";
  request += "\r\n";
  if (!send_all(sock.fd, request, address, deadline, &out.error)) return out;
  std::string raw;
  if (!read_all(sock.fd, address, max_bytes, deadline, &raw, &out.error)) return out;
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 && raw.compare(0, 9, "HTTP/1.0 ") != 0) {
    out.error = "not an HTTP answer from " + address;
    return out;
  }
  if (head_end == std::string::npos || raw.size() < 12) {
    out.error = "truncated HTTP answer from " + address;
    return out;
  }
  out.status = static_cast<int>(std::strtol(raw.substr(9, 3).c_str(), nullptr, 10));
  out.body = raw.substr(head_end + 4);
  return out;
}

}  // namespace fedwan::metrics
