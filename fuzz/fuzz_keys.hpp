// The fixed session keys of fuzz_sealed, shared with make_corpus so the
// seed corpus holds frames that authenticate under them. Test values only.
#pragma once

#include <cstdint>

#include "security/aead.hpp"

namespace fedwan::fuzz {

inline security::AeadKey fuzz_key() {
  security::AeadKey k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(0xA5 ^ (7 * i));
  return k;
}

inline security::AeadNonce fuzz_iv() {
  security::AeadNonce iv{};
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<uint8_t>(0x3C + 11 * i);
  return iv;
}

// The first input byte of fuzz_sealed: bit 0 picks the mode, bit 1 the cipher.
inline constexpr uint8_t kModeOpen = 0x00;      // open the rest of the input as it is
inline constexpr uint8_t kModeTamper = 0x01;    // seal, flip one bit, open
inline constexpr uint8_t kCipherChaCha = 0x02;  // else AES-256-GCM

inline security::AeadAlgorithm fuzz_cipher(uint8_t selector) {
  return (selector & kCipherChaCha) ? security::AeadAlgorithm::kChaCha20Poly1305
                                    : security::AeadAlgorithm::kAes256Gcm;
}

}  // namespace fedwan::fuzz
