#include "security/tls_session.hpp"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "common/openssl_check.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

using detail::OpenSslPtr;
using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using StoreCtxPtr = OpenSslPtr<X509_STORE_CTX, X509_STORE_CTX_free>;

constexpr char kExporterLabel[] = "EXPORTER-fedwan-link-keys-v1";

std::string need_file(const std::string& dir, const char* name) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  if (!std::filesystem::is_regular_file(path)) {
    throw ConfigError("credentials bundle '" + dir + "' has no " + name +
                      "; provision it with `fedwan certs init --topology FILE --out DIR` and "
                      "point the node at DIR/<node-id>");
  }
  return path;
}

std::timespec mtime_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return st.st_mtim;
}

// Adds every CRL in a PEM file to the store; the file must hold at least one.
void load_crls(X509_STORE* store, const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) throw ConfigError("cannot read CRL " + path);
  int n = 0;
  for (;;) {
    X509_CRL* crl = PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr);
    if (crl == nullptr) break;
    const int ok = X509_STORE_add_crl(store, crl);
    X509_CRL_free(crl);
    if (ok != 1) detail::throw_openssl_error("X509_STORE_add_crl");
    ++n;
  }
  ERR_clear_error();  // the loop ends on a "no start line" error
  if (n == 0) {
    throw ConfigError("CRL " + path + " holds no certificate revocation list; nodes refuse to "
                      "run without one (re-provision, or `fedwan certs revoke` writes one)");
  }
}

}  // namespace

// ---- TlsContext ---------------------------------------------------------------

TlsContext::TlsContext(const std::string& bundle_dir, bool verify_own)
    : dir_(bundle_dir), verify_own_(verify_own) {
  build();
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

void TlsContext::build() {
  const std::string ca = need_file(dir_, "ca.pem");
  const std::string cert = need_file(dir_, "cert.pem");
  const std::string key = need_file(dir_, "key.pem");
  const std::string crl = need_file(dir_, "crl.pem");

  OpenSslPtr<SSL_CTX, SSL_CTX_free> ctx(
      detail::openssl_check_ptr(SSL_CTX_new(TLS_method()), "SSL_CTX_new"));
  FEDWAN_OPENSSL_CHECK(SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION));
  FEDWAN_OPENSSL_CHECK(SSL_CTX_set_max_proto_version(ctx.get(), TLS1_3_VERSION));
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1) {
    throw ConfigError("cannot load certificate " + cert + ": " + detail::openssl_error_string());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1) {
    throw ConfigError("cannot load private key " + key + ": " + detail::openssl_error_string());
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    throw ConfigError("private key " + key + " does not match certificate " + cert);
  }
  X509_STORE* store = detail::openssl_check_ptr(X509_STORE_new(), "X509_STORE_new");
  SSL_CTX_set_cert_store(ctx.get(), store);  // the context owns it now
  if (X509_STORE_load_file(store, ca.c_str()) != 1) {
    throw ConfigError("cannot load CA certificate " + ca + ": " + detail::openssl_error_string());
  }
  load_crls(store, crl);
  FEDWAN_OPENSSL_CHECK(X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // Keys come from the exporter and the SSL object is freed right after the
  // handshake: no resumption, no tickets, no cache.
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  // Peers hold the CA already: send only the leaf certificate.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_NO_AUTO_CHAIN);

  X509* own = SSL_CTX_get0_certificate(ctx.get());
  NodeIdentity self = identity_from_certificate(own);
  // Refuse to start with credentials the peers would refuse.
  StoreCtxPtr vctx(detail::openssl_check_ptr(X509_STORE_CTX_new(), "X509_STORE_CTX_new"));
  FEDWAN_OPENSSL_CHECK(X509_STORE_CTX_init(vctx.get(), store, own, nullptr));
  if (verify_own_ && X509_verify_cert(vctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(vctx.get());
    ERR_clear_error();
    throw CryptoError("this node's certificate " + cert + " (node '" + self.node_id +
                      "') is not valid: " + X509_verify_cert_error_string(err) +
                      "; issue a new one with `fedwan certs issue`");
  }
  SSL_CTX_free(ctx_);
  ctx_ = ctx.release();
  self_ = std::move(self);
  crl_mtime_ = mtime_of(crl);
}

void TlsContext::reload_crl_if_changed() {
  const std::timespec now = mtime_of((std::filesystem::path(dir_) / "crl.pem").string());
  if (now.tv_sec == crl_mtime_.tv_sec && now.tv_nsec == crl_mtime_.tv_nsec) return;
  build();
}

// ---- keys -------------------------------------------------------------------

void LinkKeys::wipe() {
  OPENSSL_cleanse(child_to_parent_key.data(), child_to_parent_key.size());
  OPENSSL_cleanse(parent_to_child_key.data(), parent_to_child_key.size());
  OPENSSL_cleanse(child_to_parent_iv.data(), child_to_parent_iv.size());
  OPENSSL_cleanse(parent_to_child_iv.data(), parent_to_child_iv.size());
}

// ---- TlsHandshake -------------------------------------------------------------

TlsHandshake::TlsHandshake(std::shared_ptr<TlsContext> context, bool is_client)
    : context_(std::move(context)), is_client_(is_client),
      started_(std::chrono::steady_clock::now()) {
  ssl_ = detail::openssl_check_ptr(SSL_new(context_->ctx()), "SSL_new");
  BIO* rbio = BIO_new(BIO_s_mem());
  BIO* wbio = BIO_new(BIO_s_mem());
  if (rbio == nullptr || wbio == nullptr) {
    BIO_free(rbio);
    BIO_free(wbio);
    SSL_free(ssl_);
    ssl_ = nullptr;
    detail::throw_openssl_error("BIO_new");
  }
  SSL_set_bio(ssl_, rbio, wbio);  // the SSL object owns both now
  if (is_client_) {
    SSL_set_connect_state(ssl_);
  } else {
    SSL_set_accept_state(ssl_);
  }
}

TlsHandshake::~TlsHandshake() { SSL_free(ssl_); }

void TlsHandshake::fail(std::string why) {
  state_ = State::kFailed;
  error_ = std::move(why);
}

TlsHandshake::State TlsHandshake::step(const uint8_t* in, size_t size, std::vector<uint8_t>* out) {
  if (state_ != State::kInProgress || ssl_ == nullptr) return state_;
  ERR_clear_error();
  if (size > 0 && BIO_write(SSL_get_rbio(ssl_), in, static_cast<int>(size)) != static_cast<int>(size)) {
    fail("cannot buffer handshake bytes: " + detail::openssl_error_string());
    return state_;
  }
  const int rc = SSL_do_handshake(ssl_);
  const int err = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, rc);
  std::string ssl_errors;
  if (rc != 1 && err != SSL_ERROR_WANT_READ) ssl_errors = detail::openssl_error_string();
  BIO* wbio = SSL_get_wbio(ssl_);
  while (BIO_ctrl_pending(wbio) > 0) {
    uint8_t buf[4096];
    const int n = BIO_read(wbio, buf, sizeof buf);
    if (n <= 0) break;
    out->insert(out->end(), buf, buf + n);
  }
  if (rc == 1) {
    X509* cert = SSL_get0_peer_certificate(ssl_);
    if (cert == nullptr) {
      fail("peer presented no certificate");
      return state_;
    }
    try {
      peer_ = identity_from_certificate(cert);
    } catch (const CryptoError& e) {
      fail(std::string("peer certificate has no fedwan identity: ") + e.what());
      return state_;
    }
    peer_serial_ = certificate_serial_hex(cert);
    state_ = State::kDone;
    return state_;
  }
  if (err == SSL_ERROR_WANT_READ) return state_;
  const long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK) {
    std::string why = X509_verify_cert_error_string(verify);
    switch (verify) {
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
        why = "issued by an unknown CA, not this federation's (" + why + ")";
        break;
      default:
        break;
    }
    fail("peer certificate refused: " + why);
  } else {
    fail("TLS handshake failed: " + ssl_errors);
  }
  return state_;
}

LinkKeys TlsHandshake::export_keys() {
  if (state_ != State::kDone || ssl_ == nullptr) {
    FEDWAN_THROW(CryptoError, "export_keys before a completed handshake");
  }
  uint8_t buf[2 * kAeadKeySize + 2 * kAeadNonceSize];
  FEDWAN_OPENSSL_CHECK(SSL_export_keying_material(ssl_, buf, sizeof buf, kExporterLabel,
                                                  sizeof(kExporterLabel) - 1, nullptr, 0, 0));
  LinkKeys k;
  size_t off = 0;
  std::memcpy(k.child_to_parent_key.data(), buf + off, kAeadKeySize);
  off += kAeadKeySize;
  std::memcpy(k.parent_to_child_key.data(), buf + off, kAeadKeySize);
  off += kAeadKeySize;
  std::memcpy(k.child_to_parent_iv.data(), buf + off, kAeadNonceSize);
  off += kAeadNonceSize;
  std::memcpy(k.parent_to_child_iv.data(), buf + off, kAeadNonceSize);
  OPENSSL_cleanse(buf, sizeof buf);
  // SSL_free wipes the session's secrets; nothing of TLS outlives this.
  SSL_free(ssl_);
  ssl_ = nullptr;
  return k;
}

double TlsHandshake::elapsed_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_)
      .count();
}

}  // namespace fedwan::security
