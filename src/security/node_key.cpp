#include "security/node_key.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <climits>
#include <filesystem>

#include "common/atomic_file.hpp"
#include "common/openssl_check.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

using detail::openssl_check_ptr;
using detail::OpenSslPtr;
using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using MdCtxPtr = OpenSslPtr<EVP_MD_CTX, EVP_MD_CTX_free>;
using StoreCtxPtr = OpenSslPtr<X509_STORE_CTX, X509_STORE_CTX_free>;

constexpr size_t kMaxPemBytes = size_t{1} << 20;

int no_passphrase(char*, int, int, void*) { return 0; }

std::string read_pem(const std::string& path, const std::string& what) {
  ReadFileOptions o;
  o.what = what;
  o.max_bytes = kMaxPemBytes;
  o.too_large_hint = "it is not a fedwan credential file";
  return read_file(path, o);
}

BioPtr memory_bio(const std::string& text) {
  return BioPtr(openssl_check_ptr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())),
                                  "BIO_new_mem_buf"));
}

// SHA-256 over domain || 0x00 || message, fed to a sign or verify context.
template <typename Update>
void feed(Update update, std::string_view domain, const uint8_t* message, size_t n) {
  const uint8_t zero = 0;
  update(reinterpret_cast<const uint8_t*>(domain.data()), domain.size());
  update(&zero, 1);
  if (n > 0) update(message, n);
}

}  // namespace

// ---- NodeKey ------------------------------------------------------------------

std::shared_ptr<const NodeKey> NodeKey::from_bundle(const std::string& bundle_dir) {
  const std::filesystem::path dir(bundle_dir);
  const std::string key_text = read_pem((dir / "key.pem").string(), "private key");
  const std::string cert_text = read_pem((dir / "cert.pem").string(), "certificate");
  std::shared_ptr<NodeKey> k(new NodeKey());
  BioPtr kb = memory_bio(key_text);
  k->key_ = PEM_read_bio_PrivateKey(kb.get(), nullptr, no_passphrase, nullptr);
  if (k->key_ == nullptr) {
    throw CryptoError("private key " + (dir / "key.pem").string() +
                      " is not an unencrypted PEM key: " + detail::openssl_error_string());
  }
  BioPtr cb = memory_bio(cert_text);
  X509Ptr cert(PEM_read_bio_X509(cb.get(), nullptr, no_passphrase, nullptr));
  if (!cert) {
    throw CryptoError("certificate " + (dir / "cert.pem").string() +
                      " is not a PEM certificate: " + detail::openssl_error_string());
  }
  if (X509_check_private_key(cert.get(), k->key_) != 1) {
    throw CryptoError("private key " + (dir / "key.pem").string() + " does not match " +
                      (dir / "cert.pem").string() + ": " + detail::openssl_error_string());
  }
  k->identity_ = signer_identity_from_certificate(cert.get());
  const int len = i2d_X509(cert.get(), nullptr);
  if (len <= 0 || static_cast<size_t>(len) > kMaxSignerCertBytes) {
    throw CryptoError("certificate " + (dir / "cert.pem").string() + " is " + std::to_string(len) +
                      " bytes in DER; a signer's certificate is at most " +
                      std::to_string(kMaxSignerCertBytes));
  }
  k->cert_der_.resize(static_cast<size_t>(len));
  unsigned char* p = k->cert_der_.data();
  detail::openssl_check(i2d_X509(cert.get(), &p), "i2d_X509");
  const Sha256Digest d = sha256(k->cert_der_.data(), k->cert_der_.size());
  k->cert_sha256_hex_ = to_hex(d.data(), d.size());
  return k;
}

NodeKey::~NodeKey() { EVP_PKEY_free(key_); }

std::vector<uint8_t> NodeKey::sign(std::string_view domain, const uint8_t* message,
                                   size_t n) const {
  MdCtxPtr ctx(openssl_check_ptr(EVP_MD_CTX_new(), "EVP_MD_CTX_new"));
  FEDWAN_OPENSSL_CHECK(EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key_));
  feed([&](const uint8_t* p,
           size_t k) { FEDWAN_OPENSSL_CHECK(EVP_DigestSignUpdate(ctx.get(), p, k)); },
       domain, message, n);
  size_t len = 0;
  FEDWAN_OPENSSL_CHECK(EVP_DigestSignFinal(ctx.get(), nullptr, &len));
  std::vector<uint8_t> sig(len);
  FEDWAN_OPENSSL_CHECK(EVP_DigestSignFinal(ctx.get(), sig.data(), &len));
  sig.resize(len);
  if (sig.size() > kMaxSignatureBytes) {
    throw CryptoError("a signature of " + std::to_string(sig.size()) +
                      " bytes is longer than records hold (" + std::to_string(kMaxSignatureBytes) +
                      "); use an ECDSA key");
  }
  return sig;
}

// ---- SignatureVerifier ----------------------------------------------------------

SignatureVerifier::SignatureVerifier(const std::string& ca_pem_file,
                                     const std::string& crl_pem_file) {
  OpenSslPtr<X509_STORE, X509_STORE_free> store(
      openssl_check_ptr(X509_STORE_new(), "X509_STORE_new"));
  const std::string ca_text = read_pem(ca_pem_file, "CA certificate");
  BioPtr cb = memory_bio(ca_text);
  int cas = 0;
  for (;;) {
    X509Ptr ca(PEM_read_bio_X509(cb.get(), nullptr, no_passphrase, nullptr));
    if (!ca) break;
    FEDWAN_OPENSSL_CHECK(X509_STORE_add_cert(store.get(), ca.get()));
    ++cas;
  }
  ERR_clear_error();  // the loop ends on "no start line"
  if (cas == 0) throw CryptoError(ca_pem_file + " holds no PEM certificate");
  unsigned long flags = X509_V_FLAG_NO_CHECK_TIME;
  if (!crl_pem_file.empty()) {
    const std::string crl_text = read_pem(crl_pem_file, "CRL");
    BioPtr rb = memory_bio(crl_text);
    int crls = 0;
    for (;;) {
      X509_CRL* crl = PEM_read_bio_X509_CRL(rb.get(), nullptr, no_passphrase, nullptr);
      if (crl == nullptr) break;
      const int ok = X509_STORE_add_crl(store.get(), crl);
      X509_CRL_free(crl);
      FEDWAN_OPENSSL_CHECK(ok);
      ++crls;
    }
    ERR_clear_error();
    if (crls == 0) throw CryptoError(crl_pem_file + " holds no PEM CRL");
    flags |= X509_V_FLAG_CRL_CHECK;
  }
  FEDWAN_OPENSSL_CHECK(X509_STORE_set_flags(store.get(), flags));
  store_ = store.release();
}

std::shared_ptr<const SignatureVerifier> SignatureVerifier::from_bundle(
    const std::string& bundle_dir) {
  const std::filesystem::path dir(bundle_dir);
  return std::make_shared<const SignatureVerifier>((dir / "ca.pem").string(),
                                                   (dir / "crl.pem").string());
}

SignatureVerifier::~SignatureVerifier() { X509_STORE_free(store_); }

std::optional<std::string> SignatureVerifier::verify(const std::vector<uint8_t>& cert_der,
                                                     std::string_view domain,
                                                     const uint8_t* message, size_t n,
                                                     const std::vector<uint8_t>& signature,
                                                     const ExpectedSigner& expected) const {
  try {
    if (cert_der.empty() || cert_der.size() > kMaxSignerCertBytes) {
      return "the signer's certificate is " + std::to_string(cert_der.size()) + " bytes, not 1.." +
             std::to_string(kMaxSignerCertBytes);
    }
    if (signature.empty() || signature.size() > kMaxSignatureBytes) {
      return "the signature is " + std::to_string(signature.size()) + " bytes, not 1.." +
             std::to_string(kMaxSignatureBytes);
    }
    const unsigned char* p = cert_der.data();
    X509Ptr cert(d2i_X509(nullptr, &p, static_cast<long>(cert_der.size())));
    if (!cert || p != cert_der.data() + cert_der.size()) {
      ERR_clear_error();
      return std::string("the signer's certificate is not one DER certificate");
    }
    StoreCtxPtr vctx(openssl_check_ptr(X509_STORE_CTX_new(), "X509_STORE_CTX_new"));
    FEDWAN_OPENSSL_CHECK(X509_STORE_CTX_init(vctx.get(), store_, cert.get(), nullptr));
    if (X509_verify_cert(vctx.get()) != 1) {
      const int err = X509_STORE_CTX_get_error(vctx.get());
      ERR_clear_error();
      return std::string("the signer's certificate does not verify against the federation CA: ") +
             X509_verify_cert_error_string(err);
    }
    NodeIdentity who;
    try {
      who = signer_identity_from_certificate(cert.get());
    } catch (const CryptoError& e) {
      return std::string("the signer's certificate names no fedwan node: ") + e.what();
    }
    if (who.admin != expected.admin) {
      return who.admin
                 ? std::string("signed by the federation's admin certificate, not by node '") +
                       expected.node_id + "'"
                 : "signed by node '" + who.node_id +
                       "', not by the federation's admin certificate";
    }
    if (who.node_id != expected.node_id) {
      return "signed by '" + who.node_id + "', not by '" + expected.node_id + "'";
    }
    if (!who.admin && expected.role && who.role != *expected.role) {
      return std::string("signed by a ") + role_ou(who.role) + " certificate, expected a " +
             role_ou(*expected.role) + "'s";
    }
    if (!expected.job.empty() && who.job != expected.job) {
      return "signed for job '" + who.job + "', not '" + expected.job + "'";
    }
    MdCtxPtr ctx(openssl_check_ptr(EVP_MD_CTX_new(), "EVP_MD_CTX_new"));
    if (EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr,
                             X509_get0_pubkey(cert.get())) != 1) {
      ERR_clear_error();
      return std::string("the signer's key cannot verify signatures");
    }
    bool fed = true;
    feed([&](const uint8_t* q,
             size_t k) { fed = fed && EVP_DigestVerifyUpdate(ctx.get(), q, k) == 1; },
         domain, message, n);
    if (!fed || EVP_DigestVerifyFinal(ctx.get(), signature.data(), signature.size()) != 1) {
      ERR_clear_error();
      return "the signature of '" + who.node_id + "' does not match the record";
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    ERR_clear_error();
    return std::string("could not check the signature: ") + e.what();
  }
}

// ---- base64 ------------------------------------------------------------------------

std::string base64_encode(const std::vector<uint8_t>& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes.data(),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<std::vector<uint8_t>> base64_decode(std::string_view text, size_t max_bytes) {
  if (text.empty() || text.size() % 4 != 0 || text.size() / 4 * 3 > max_bytes + 2 ||
      text.size() > INT_MAX) {
    return std::nullopt;
  }
  for (char c : text) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '+' || c == '/' || c == '=';
    if (!ok) return std::nullopt;
  }
  std::vector<uint8_t> out(text.size() / 4 * 3);
  const int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock keeps the bytes the padding stands for: drop them.
  size_t pad = 0;
  if (text.back() == '=') ++pad;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++pad;
  size_t len = static_cast<size_t>(n);
  if (pad > len) return std::nullopt;
  len -= pad;
  if (len > max_bytes) return std::nullopt;
  out.resize(len);
  // Canonical only: encoding back gives the same text.
  if (base64_encode(out) != text) return std::nullopt;
  return out;
}

}  // namespace fedwan::security
