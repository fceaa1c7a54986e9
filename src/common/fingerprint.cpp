#include "common/fingerprint.hpp"

#include <openssl/rand.h>
#include <xxhash.h>

#include <array>

#include "common/openssl_check.hpp"

namespace fedwan {
namespace {

// As long as XXH3's own default secret.
using Secret = std::array<unsigned char, 192>;
static_assert(std::tuple_size_v<Secret> >= XXH3_SECRET_SIZE_MIN);

const Secret& process_secret() {
  static const Secret secret = [] {
    Secret s{};
    detail::openssl_check(RAND_bytes(s.data(), static_cast<int>(s.size())), "RAND_bytes");
    return s;
  }();
  return secret;
}

}  // namespace

uint64_t fingerprint64(const void* data, size_t n) {
  // XXH3 takes the secret as it is: drawn at random, it needs no mixing.
  static const Secret& secret = process_secret();
  return XXH3_64bits_withSecret(n == 0 ? "" : data, n, secret.data(), secret.size());
}

}  // namespace fedwan
