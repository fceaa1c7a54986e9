// A plain POSIX-socket HTTP/1.1 client for the metrics server's tests: what
// a scraper or a hostile client sends, byte for byte. Every read gives up
// after `read_timeout` (10 s unless told), so a server that hangs fails the
// test instead of blocking it. Not thread safe: one thread per client.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fedwan::testing {

class HttpTestClient {
 public:
  // Connects to 127.0.0.1:port from `source` (an address of 127.0.0.0/8,
  // so that tests can be several clients; the kernel's choice when empty).
  explicit HttpTestClient(uint16_t port, const std::string& source = "",
                          std::chrono::milliseconds read_timeout = std::chrono::seconds(10)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket");
    timeval tv{static_cast<time_t>(read_timeout.count() / 1000),
               static_cast<suseconds_t>(read_timeout.count() % 1000 * 1000)};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (!source.empty()) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
        throw std::runtime_error("cannot bind a client to " + source);
      }
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~HttpTestClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  HttpTestClient(const HttpTestClient&) = delete;
  HttpTestClient& operator=(const HttpTestClient&) = delete;

  bool connected() const { return connected_; }

  // False when the server closed on us (the reply, if any, says why).
  bool send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Everything until the server closes; `closed` says whether it did (as
  // opposed to the read timeout running out).
  std::string read_all(bool* closed = nullptr) {
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (closed) *closed = n == 0 || errno == ECONNRESET;
      return out;
    }
  }

  // One response read by its Content-Length, leaving the connection open;
  // what came before the server closed or the timeout, otherwise.
  std::string read_response() {
    std::string out;
    char buf[4096];
    for (;;) {
      const size_t end = out.find("\r\n\r\n");
      if (end != std::string::npos) {
        const size_t cl = out.find("Content-Length: ");
        const size_t len = cl == std::string::npos ? 0 : std::stoul(out.substr(cl + 16));
        if (out.size() >= end + 4 + len) return out;
      }
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// Whether an answer starts with this status line's code ("200", "401").
inline bool has_status(const std::string& response, const char* code) {
  return response.rfind(std::string("HTTP/1.1 ") + code, 0) == 0 ||
         response.rfind(std::string("HTTP/1.0 ") + code, 0) == 0;
}

}  // namespace fedwan::testing
