// The one checking wrapper for OpenSSL calls. Every OpenSSL call in fedwan
// goes through openssl_check()/openssl_check_ptr() so a failure becomes a
// fedwan::CryptoError carrying OpenSSL's own reason, and every handle is
// owned by an OpenSslPtr. Private header: OpenSSL types stay out of include/.
#pragma once

#include <openssl/err.h>

#include <memory>
#include <string>

#include "fedwan/error.hpp"

namespace fedwan::detail {

// Drains this thread's OpenSSL error queue into one line. The queue is per
// thread, so draining it here also keeps a stale entry from being blamed on
// the next, unrelated failure.
inline std::string openssl_error_string() {
  std::string out;
  char buf[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no OpenSSL error recorded") : out;
}

[[noreturn]] inline void throw_openssl_error(const char* what) {
  throw CryptoError(std::string(what) + " failed: " + openssl_error_string());
}

// Most OpenSSL calls return 1 on success and 0 or a negative value on failure.
// Calls whose non-positive results are not errors (BIO reads that would block,
// SSL_do_handshake wanting I/O) must be handled by the caller, not here.
inline int openssl_check(int rc, const char* what) {
  if (rc <= 0) throw_openssl_error(what);
  return rc;
}

// For constructors such as EVP_MD_CTX_new() that return nullptr on failure.
template <typename T>
T* openssl_check_ptr(T* p, const char* what) {
  if (p == nullptr) throw_openssl_error(what);
  return p;
}

// unique_ptr deleter calling the matching OpenSSL free function, e.g.
//   OpenSslPtr<EVP_MD_CTX, EVP_MD_CTX_free>
template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const noexcept { Free(p); }
};
template <typename T, void (*Free)(T*)>
using OpenSslPtr = std::unique_ptr<T, OpenSslDeleter<T, Free>>;

// The add0/push calls take ownership of their argument only when they
// succeed, so it stays in its OpenSslPtr until the call is checked (a failed
// call leaves it to be freed there); then this lets go of it:
//   FEDWAN_OPENSSL_CHECK(X509_CRL_add0_revoked(crl.get(), entry.get()));
//   handed_to_openssl(entry);
// Returns the pointer, which the object the call added it to now frees.
template <typename T, void (*Free)(T*)>
T* handed_to_openssl(OpenSslPtr<T, Free>& owned) {
  return owned.release();
}

}  // namespace fedwan::detail

// Checks an OpenSSL call that returns 1 on success, naming the call in the error.
#define FEDWAN_OPENSSL_CHECK(call) ::fedwan::detail::openssl_check((call), #call)
