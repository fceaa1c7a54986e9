#include "common/fingerprint.hpp"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <array>

#include "common/openssl_check.hpp"

namespace fedwan {
namespace {

using Key = std::array<unsigned char, 32>;

const Key& process_key() {
  static const Key key = [] {
    Key k{};
    detail::openssl_check(RAND_bytes(k.data(), static_cast<int>(k.size())), "RAND_bytes");
    return k;
  }();
  return key;
}

}  // namespace

uint64_t fingerprint64(const void* data, size_t n) {
  // GMAC: the bytes as GCM's associated data, nothing encrypted. The nonce
  // is fixed: the tags are only compared inside this process, never shown.
  static const std::array<unsigned char, 12> kNonce{};
  thread_local detail::OpenSslPtr<EVP_CIPHER_CTX, EVP_CIPHER_CTX_free> ctx(
      detail::openssl_check_ptr(EVP_CIPHER_CTX_new(), "EVP_CIPHER_CTX_new"));
  EVP_CIPHER_CTX* c = ctx.get();
  detail::openssl_check(
      EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, process_key().data(), kNonce.data()),
      "EVP_EncryptInit_ex (GMAC)");
  const auto* p = static_cast<const unsigned char*>(data);
  // EVP takes int lengths: a large string goes in pieces.
  constexpr size_t kPiece = size_t{1} << 30;
  for (size_t at = 0; at < n; at += kPiece) {
    const int len = static_cast<int>(n - at < kPiece ? n - at : kPiece);
    int out_len = 0;
    detail::openssl_check(EVP_EncryptUpdate(c, nullptr, &out_len, p + at, len),
                          "EVP_EncryptUpdate (GMAC)");
  }
  int out_len = 0;
  unsigned char none[16];
  detail::openssl_check(EVP_EncryptFinal_ex(c, none, &out_len), "EVP_EncryptFinal_ex (GMAC)");
  std::array<unsigned char, 16> tag{};
  detail::openssl_check(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag.data()),
                        "EVP_CTRL_GCM_GET_TAG");
  uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out = (out << 8) | tag[static_cast<size_t>(i)];
  return out;
}

}  // namespace fedwan
