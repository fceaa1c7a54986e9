#include "common/sha256.hpp"

#include <openssl/evp.h>

#include "common/keep_alive.hpp"
#include "common/openssl_check.hpp"

namespace fedwan {

struct Sha256::Impl {
  detail::OpenSslPtr<EVP_MD_CTX, EVP_MD_CTX_free> ctx;

  Impl() : ctx(detail::openssl_check_ptr(EVP_MD_CTX_new(), "EVP_MD_CTX_new")) { init(); }
  void init() { FEDWAN_OPENSSL_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr)); }
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, size_t n) {
  if (!impl_) throw CryptoError("Sha256::update on a moved-from hasher");
  if (n == 0) return;  // data may legitimately be null for an empty range
  // A model's worth in pieces, so that a node hashing one keeps its
  // heartbeats going between them (common/keep_alive.hpp).
  constexpr size_t kPiece = 16 << 20;
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > kPiece) {
    FEDWAN_OPENSSL_CHECK(EVP_DigestUpdate(impl_->ctx.get(), p, kPiece));
    p += kPiece;
    n -= kPiece;
    KeepAlive::pulse();
  }
  FEDWAN_OPENSSL_CHECK(EVP_DigestUpdate(impl_->ctx.get(), p, n));
}

std::array<uint8_t, 32> Sha256::finish() {
  if (!impl_) throw CryptoError("Sha256::finish on a moved-from hasher");
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  FEDWAN_OPENSSL_CHECK(EVP_DigestFinal_ex(impl_->ctx.get(), out.data(), &len));
  if (len != out.size()) {
    throw CryptoError("EVP_DigestFinal_ex returned " + std::to_string(len) +
                      " bytes for SHA-256, expected 32");
  }
  impl_->init();
  return out;
}

Sha256Digest sha256(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.finish();
}

std::string to_hex(const uint8_t* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0x0f];
  }
  return out;
}

}  // namespace fedwan
