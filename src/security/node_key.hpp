// Signatures that prove a record is a node's own: its audit heads and its
// checkpoints. The node signs with the private key of its credentials bundle
// (the key its TLS identity uses) and ships its certificate with the
// signature; anyone holding the federation CA can check both. A parent that
// keeps a child's checkpoint, or anyone who can write a node's disk, cannot
// forge one without that node's key.
//
// Signatures are ECDSA (or whatever the bundle's key is) over SHA-256 of
//   domain || 0x00 || message
// where the domain names what is signed ("fedwan-checkpoint-v2", ...), so a
// signature over one kind of record never passes for another.
//
// Thread safety: both classes are immutable after construction and may be
// shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "security/identity.hpp"

typedef struct evp_pkey_st EVP_PKEY;
typedef struct x509_store_st X509_STORE;

namespace fedwan::security {

inline constexpr size_t kMaxSignerCertBytes = 4096;  // DER
inline constexpr size_t kMaxSignatureBytes = 128;    // DER ECDSA P-521 fits

class NodeKey {
 public:
  // Loads key.pem and cert.pem from a credentials bundle (a node's or the
  // admin's). Throws ConfigError
  // (missing or oversized files) or CryptoError (not a key and certificate
  // that belong together, or a certificate without a fedwan identity).
  static std::shared_ptr<const NodeKey> from_bundle(const std::string& bundle_dir);
  ~NodeKey();
  NodeKey(const NodeKey&) = delete;
  NodeKey& operator=(const NodeKey&) = delete;

  // The signature (DER) of `message` under `domain`. Throws CryptoError.
  std::vector<uint8_t> sign(std::string_view domain, const uint8_t* message, size_t n) const;
  std::vector<uint8_t> sign(std::string_view domain, std::string_view message) const {
    return sign(domain, reinterpret_cast<const uint8_t*>(message.data()), message.size());
  }
  const std::vector<uint8_t>& cert_der() const { return cert_der_; }
  const std::string& cert_sha256_hex() const { return cert_sha256_hex_; }
  const NodeIdentity& identity() const { return identity_; }

 private:
  NodeKey() = default;
  EVP_PKEY* key_ = nullptr;
  std::vector<uint8_t> cert_der_;
  std::string cert_sha256_hex_;
  NodeIdentity identity_;
};

// Who a signature must come from: the node id always; role and job when set.
struct ExpectedSigner {
  std::string node_id;
  std::optional<Role> role;
  std::string job;  // empty: any
  // The federation's admin (node_id kAdminName) rather than a node: a
  // node's signature never passes for the admin's, nor the reverse.
  bool admin = false;
};

class SignatureVerifier {
 public:
  // The CA certificate(s) in `ca_pem_file`, and the CRL in `crl_pem_file`
  // when one is given (empty: revocation is not checked). Throws ConfigError
  // or CryptoError when the files cannot be read or parsed.
  explicit SignatureVerifier(const std::string& ca_pem_file, const std::string& crl_pem_file = "");
  // ca.pem and crl.pem of a credentials bundle.
  static std::shared_ptr<const SignatureVerifier> from_bundle(const std::string& bundle_dir);
  ~SignatureVerifier();
  SignatureVerifier(const SignatureVerifier&) = delete;
  SignatureVerifier& operator=(const SignatureVerifier&) = delete;

  // nullopt when `signature` is `cert_der`'s key's signature of `message`
  // under `domain`, the certificate was issued by the CA (its validity dates
  // are not checked: a record signed while it was valid stays signed), is
  // not revoked by the CRL, and names `expected`. Otherwise why not, in
  // words. Never throws on bad input.
  std::optional<std::string> verify(const std::vector<uint8_t>& cert_der, std::string_view domain,
                                    const uint8_t* message, size_t n,
                                    const std::vector<uint8_t>& signature,
                                    const ExpectedSigner& expected) const;
  std::optional<std::string> verify(const std::vector<uint8_t>& cert_der, std::string_view domain,
                                    std::string_view message, const std::vector<uint8_t>& signature,
                                    const ExpectedSigner& expected) const {
    return verify(cert_der, domain, reinterpret_cast<const uint8_t*>(message.data()),
                  message.size(), signature, expected);
  }

 private:
  X509_STORE* store_ = nullptr;
};

// Base64 (standard alphabet, padded) for signatures and certificates in
// JSON records. decode returns nullopt on anything that is not base64.
std::string base64_encode(const std::vector<uint8_t>& bytes);
std::optional<std::vector<uint8_t>> base64_decode(std::string_view text, size_t max_bytes);

}  // namespace fedwan::security
