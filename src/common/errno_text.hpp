// The text of an errno value ("No such file or directory"), as strerror
// gives it but thread safe: node loops, links and the audit writer report
// I/O failures from their own threads, and strerror may hand them all one
// shared buffer.
#pragma once

#include <string.h>  // strerror_r: POSIX, which <cstring> need not declare

#include <string>

namespace fedwan {
namespace detail {

// strerror_r comes in two shapes. glibc's GNU one (g++ defines _GNU_SOURCE)
// returns the text, which may be a static string rather than `buf`; the XSI
// one fills `buf` and returns 0, or an error number for an unknown `err`.
inline std::string strerror_r_text(const char* text, const char* /*buf*/, int /*err*/) {
  return text;
}
inline std::string strerror_r_text(int rc, const char* buf, int err) {
  return rc == 0 ? std::string(buf) : "Unknown error " + std::to_string(err);
}

}  // namespace detail

inline std::string errno_text(int err) {
  char buf[256] = {};
  return detail::strerror_r_text(strerror_r(err, buf, sizeof buf), buf, err);
}

}  // namespace fedwan
