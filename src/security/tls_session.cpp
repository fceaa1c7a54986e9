#include "security/tls_session.hpp"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/openssl_check.hpp"
#include "common/sha256.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"

namespace fedwan::security {
namespace {

using detail::OpenSslPtr;
using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using StoreCtxPtr = OpenSslPtr<X509_STORE_CTX, X509_STORE_CTX_free>;

// v2: the exporter's context names the frame cipher (export_keys).
constexpr char kExporterLabel[] = "EXPORTER-fedwan-link-keys-v2";
// The session's first key epoch (LinkKeys::first_epoch). Exported without
// the cipher's context: a cipher rewritten on the path gives the two ends
// different keys but the same first epoch, so its frames fail as tampered
// ones (a bad tag), not as another session's.
constexpr char kEpochLabel[] = "EXPORTER-fedwan-link-epoch-v1";

// Credentials are small; a larger file is a mistake or an attack, refused
// before anything reads it whole. A CRL grows with its revocations.
constexpr off_t kMaxCredentialBytes = off_t{1} << 20;
constexpr off_t kMaxCrlBytes = off_t{16} << 20;

std::string need_file(const std::string& dir, const char* name, off_t max_bytes) {
  std::string path = (std::filesystem::path(dir) / name).string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw ConfigError("credentials bundle '" + dir + "' has no " + name +
                      "; provision it with `fedwan certs init --topology FILE --out DIR` and "
                      "point the node at DIR/<node-id>");
  }
  if (st.st_size > max_bytes) {
    throw ConfigError(path + " is " + std::to_string(st.st_size) + " bytes, more than a " + name +
                      " can be (" + std::to_string(max_bytes) + "); it is not a fedwan " +
                      "credential file");
  }
  return path;
}

int no_passphrase(char*, int, int, void*) { return 0; }

std::time_t asn1_time_t(const ASN1_TIME* t) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) {
    ERR_clear_error();
    throw CryptoError("unreadable time in a CRL");
  }
  return timegm(&tm);
}

using CrlPtr = OpenSslPtr<X509_CRL, X509_CRL_free>;

// Every CRL in `text`, each signed by one of `cas` and carrying a
// nextUpdate; throws CryptoError naming the problem otherwise. `last` and
// `next` get the earliest of their dates over the CRLs.
std::vector<CrlPtr> parse_crls(const std::string& text, const std::vector<X509Ptr>& cas,
                               const std::string& path, std::time_t* last, std::time_t* next) {
  BioPtr bio(detail::openssl_check_ptr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())),
                                       "BIO_new_mem_buf"));
  std::vector<CrlPtr> out;
  *last = *next = 0;
  for (;;) {
    CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, no_passphrase, nullptr));
    if (!crl) break;
    bool signed_by_ca = false;
    for (const X509Ptr& ca : cas) {
      if (X509_NAME_cmp(X509_CRL_get_issuer(crl.get()), X509_get_subject_name(ca.get())) == 0 &&
          X509_CRL_verify(crl.get(), X509_get0_pubkey(ca.get())) == 1) {
        signed_by_ca = true;
        break;
      }
    }
    ERR_clear_error();
    if (!signed_by_ca) {
      throw CryptoError("CRL " + path + " is not signed by the federation CA");
    }
    if (X509_CRL_get0_nextUpdate(crl.get()) == nullptr) {
      throw CryptoError("CRL " + path + " has no nextUpdate; fedwan CRLs always carry one");
    }
    const std::time_t l = asn1_time_t(X509_CRL_get0_lastUpdate(crl.get()));
    const std::time_t n = asn1_time_t(X509_CRL_get0_nextUpdate(crl.get()));
    *last = out.empty() ? l : std::min(*last, l);
    *next = out.empty() ? n : std::min(*next, n);
    out.push_back(std::move(crl));
  }
  ERR_clear_error();  // the loop ends on a "no start line" error
  if (out.empty()) {
    throw CryptoError("CRL " + path +
                      " holds no certificate revocation list (a half-written "
                      "or damaged file?); nodes need one: `fedwan certs crl refresh` writes a "
                      "new one");
  }
  return out;
}

std::vector<X509Ptr> read_cas(const std::string& path) {
  BioPtr bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) throw ConfigError("cannot read CA certificate " + path);
  std::vector<X509Ptr> out;
  for (;;) {
    X509Ptr ca(PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr));
    if (!ca) break;
    out.push_back(std::move(ca));
  }
  ERR_clear_error();
  if (out.empty()) throw ConfigError("CA certificate file " + path + " holds no certificate");
  return out;
}

std::string read_crl_text(const std::string& path) {
  ReadFileOptions o;
  o.what = "CRL";
  o.max_bytes = static_cast<size_t>(kMaxCrlBytes);
  o.too_large_hint = "it is not a fedwan CRL";
  return read_file(path, o);
}

// The TlsContext a verification runs for: through the SSL object during a
// handshake, or the store context's app data when a node checks its own
// certificate.
const TlsContext* context_of(X509_STORE_CTX* sctx) {
  const int idx = SSL_get_ex_data_X509_STORE_CTX_idx();
  if (idx >= 0) {
    if (auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(sctx, idx))) {
      return static_cast<const TlsContext*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
    }
  }
  return static_cast<const TlsContext*>(X509_STORE_CTX_get_app_data(sctx));
}

// An expired CRL still revokes what it lists during the grace period.
int verify_callback(int ok, X509_STORE_CTX* sctx) {
  if (ok == 1) return 1;
  if (X509_STORE_CTX_get_error(sctx) != X509_V_ERR_CRL_HAS_EXPIRED) return 0;
  const TlsContext* self = context_of(sctx);
  if (self == nullptr ||
      !crl_in_grace(self->crl_next_update(), self->crl_grace(), std::time(nullptr))) {
    return 0;
  }
  X509_STORE_CTX_set_error(sctx, X509_V_OK);
  return 1;
}

}  // namespace

bool crl_in_grace(std::time_t next_update, std::chrono::seconds grace, std::time_t now) {
  return now <= next_update || now - next_update <= grace.count();
}

// ---- TlsContext ---------------------------------------------------------------

TlsContext::TlsContext(const std::string& bundle_dir, bool verify_own,
                       std::chrono::seconds crl_grace)
    : dir_(bundle_dir), verify_own_(verify_own), crl_grace_(crl_grace) {
  const std::string crl = need_file(dir_, "crl.pem", kMaxCrlBytes);
  const std::string text = read_crl_text(crl);
  crl_digest_ = sha256(text.data(), text.size());
  build(text);
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

void TlsContext::build(const std::string& crl_text) {
  const std::string ca = need_file(dir_, "ca.pem", kMaxCredentialBytes);
  const std::string cert = need_file(dir_, "cert.pem", kMaxCredentialBytes);
  const std::string key = need_file(dir_, "key.pem", kMaxCredentialBytes);
  const std::string crl = (std::filesystem::path(dir_) / "crl.pem").string();

  const std::vector<X509Ptr> cas = read_cas(ca);
  std::time_t last = 0, next = 0;
  const std::vector<CrlPtr> crls = parse_crls(crl_text, cas, crl, &last, &next);

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
  for (const X509Ptr& c : cas) FEDWAN_OPENSSL_CHECK(X509_STORE_add_cert(store, c.get()));
  for (const CrlPtr& c : crls) FEDWAN_OPENSSL_CHECK(X509_STORE_add_crl(store, c.get()));
  FEDWAN_OPENSSL_CHECK(X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_callback);
  SSL_CTX_set_app_data(ctx.get(), this);
  // Keys come from the exporter and the SSL object is freed right after the
  // handshake: no resumption, no tickets, no cache.
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  // Peers hold the CA already: send only the leaf certificate.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_NO_AUTO_CHAIN);

  X509* own = SSL_CTX_get0_certificate(ctx.get());
  NodeIdentity self = identity_from_certificate(own);
  // The dates the verify callback judges an expired CRL by.
  const std::time_t old_last = crl_last_update_, old_next = crl_next_update_;
  crl_last_update_ = last;
  crl_next_update_ = next;
  // Refuse to start with credentials the peers would refuse.
  StoreCtxPtr vctx(detail::openssl_check_ptr(X509_STORE_CTX_new(), "X509_STORE_CTX_new"));
  FEDWAN_OPENSSL_CHECK(X509_STORE_CTX_init(vctx.get(), store, own, nullptr));
  X509_STORE_CTX_set_verify_cb(vctx.get(), verify_callback);
  X509_STORE_CTX_set_app_data(vctx.get(), this);
  if (verify_own_ && X509_verify_cert(vctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(vctx.get());
    ERR_clear_error();
    crl_last_update_ = old_last;
    crl_next_update_ = old_next;
    if (err == X509_V_ERR_CRL_HAS_EXPIRED) {
      throw CryptoError("the CRL " + crl + " expired at " + utc_text(next) + ", more than " +
                        std::to_string(crl_grace_.count() / 3600) +
                        " hours ago (its grace period): refresh it where the CA key is, with "
                        "`fedwan certs crl refresh --out DIR`, and copy DIR/ca/crl.pem into "
                        "every node's bundle; the certificates themselves are fine");
    }
    if (err == X509_V_ERR_CRL_NOT_YET_VALID) {
      throw CryptoError("the CRL " + crl + " is not valid before " + utc_text(last) +
                        ": this machine's clock is behind the CA's; fix the clock");
    }
    std::string advice = "issue a new one with `fedwan certs issue`";
    if (err == X509_V_ERR_CERT_NOT_YET_VALID) advice = "check this machine's clock, or " + advice;
    throw CryptoError("this node's certificate " + cert + " (node '" + self.node_id +
                      "') is not valid: " + X509_verify_cert_error_string(err) + "; " + advice);
  }
  SSL_CTX_free(ctx_);
  ctx_ = ctx.release();
  self_ = std::move(self);
}

bool TlsContext::reload_crl_if_changed() {
  // By content: a CRL copied in with the old one's size and time (`cp -p`,
  // `rsync -t`), or issued within the same second, is a change all the same.
  const std::string path = (std::filesystem::path(dir_) / "crl.pem").string();
  std::string text;
  std::string problem;
  try {
    text = read_crl_text(path);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  const Sha256Digest digest = sha256(text.data(), text.size());
  if (problem.empty() && digest == crl_digest_) return false;
  if (!problem.empty()) {
    // Keep serving with the last good CRL; the node raises its alarm.
    crl_problem_ = problem + "; the CRL loaded before stays in force";
    crl_digest_ = {};
    return false;
  }
  crl_digest_ = digest;
  try {
    build(text);
    crl_problem_.clear();
    return true;
  } catch (const std::exception& e) {
    crl_problem_ = std::string(e.what()) + "; the CRL loaded before stays in force";
    return false;
  }
}

// ---- keys -------------------------------------------------------------------

void LinkKeys::wipe() {
  OPENSSL_cleanse(child_to_parent_key.data(), child_to_parent_key.size());
  OPENSSL_cleanse(parent_to_child_key.data(), parent_to_child_key.size());
  OPENSSL_cleanse(child_to_parent_iv.data(), child_to_parent_iv.size());
  OPENSSL_cleanse(parent_to_child_iv.data(), parent_to_child_iv.size());
  first_epoch = 0;
}

// ---- TlsHandshake -------------------------------------------------------------

TlsHandshake::TlsHandshake(std::shared_ptr<TlsContext> context, bool is_client)
    : context_(std::move(context)),
      is_client_(is_client),
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
  if (size > 0 &&
      BIO_write(SSL_get_rbio(ssl_), in, static_cast<int>(size)) != static_cast<int>(size)) {
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
      case X509_V_ERR_CRL_HAS_EXPIRED:
        why = "this node's CRL expired at " + utc_text(context_->crl_next_update()) +
              " and its grace period is over (" + why +
              "); refresh it where the CA key is "
              "with `fedwan certs crl refresh --out DIR` and copy DIR/ca/crl.pem to every node";
        break;
      default: break;
    }
    fail("peer certificate refused: " + why);
  } else {
    fail("TLS handshake failed: " + ssl_errors);
  }
  return state_;
}

LinkKeys TlsHandshake::export_keys(AeadAlgorithm cipher) {
  if (state_ != State::kDone || ssl_ == nullptr) {
    FEDWAN_THROW(CryptoError, "export_keys before a completed handshake");
  }
  uint8_t epoch[4];
  FEDWAN_OPENSSL_CHECK(SSL_export_keying_material(ssl_, epoch, sizeof epoch, kEpochLabel,
                                                  sizeof(kEpochLabel) - 1, nullptr, 0, 0));
  uint8_t buf[2 * kAeadKeySize + 2 * kAeadNonceSize];
  const std::string context = std::string("fedwan frame cipher ") + aead_name(cipher);
  FEDWAN_OPENSSL_CHECK(SSL_export_keying_material(
      ssl_, buf, sizeof buf, kExporterLabel, sizeof(kExporterLabel) - 1,
      reinterpret_cast<const unsigned char*>(context.data()), context.size(), 1));
  LinkKeys k;
  k.first_epoch = uint32_t{epoch[0]} | uint32_t{epoch[1]} << 8 | uint32_t{epoch[2]} << 16 |
                  uint32_t{epoch[3]} << 24;
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
