#include "security/certs.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <climits>
#include <ctime>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/openssl_check.hpp"
#include "common/utc_time.hpp"
#include "fedwan/error.hpp"
#include "security/ca_certificates.hpp"
#include "security/ca_files.hpp"

namespace fedwan::security {
namespace ca_detail {

namespace fs = std::filesystem;
using detail::openssl_check_ptr;

namespace {
constexpr size_t kMaxFileBytes = 16 << 20;
}  // namespace

// ---- files -----------------------------------------------------------------

// A file of the federation directory: a missing one means it was never
// provisioned, one over 16 MiB is not a credential.
std::string read_federation_file(const fs::path& path, const std::string& what) {
  ReadFileOptions options;
  options.what = what;
  options.max_bytes = kMaxFileBytes;
  options.too_large_hint = "it is not a fedwan credential file";
  std::optional<std::string> text = read_file_if_exists(path, options);
  if (!text) {
    throw ConfigError(what + " " + path.string() +
                      " does not exist; provision the federation first with `fedwan certs "
                      "init` (or pass the directory it wrote)");
  }
  return std::move(*text);
}

// ---- OpenSSL helpers ---------------------------------------------------------

int no_passphrase(char*, int, int, void*) { return 0; }

BioPtr read_bio(const std::string& text) {
  if (text.size() > static_cast<size_t>(INT_MAX)) throw CryptoError("PEM text too large");
  return BioPtr(openssl_check_ptr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())),
                                  "BIO_new_mem_buf"));
}

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n < 0 || (n > 0 && data == nullptr)) throw CryptoError("BIO_get_mem_data failed");
  return std::string(data, static_cast<size_t>(n));
}

BioPtr write_bio() { return BioPtr(openssl_check_ptr(BIO_new(BIO_s_mem()), "BIO_new")); }

std::string cert_pem(X509* cert) {
  BioPtr bio = write_bio();
  FEDWAN_OPENSSL_CHECK(PEM_write_bio_X509(bio.get(), cert));
  return bio_text(bio.get());
}

// Private key text, wiped when it goes out of scope.
struct SecretText {
  std::string text;
  ~SecretText() { OPENSSL_cleanse(text.data(), text.size()); }
};

SecretText key_pem(EVP_PKEY* key) {
  // A secure-heap BIO: its buffer is wiped when freed.
  BioPtr bio(openssl_check_ptr(BIO_new(BIO_s_secmem()), "BIO_new(BIO_s_secmem)"));
  FEDWAN_OPENSSL_CHECK(
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr));
  return SecretText{bio_text(bio.get())};
}

void free_openssl_chars(char* p) { OPENSSL_free(p); }

// "2026-11-24T10:00:00Z".
std::string asn1_time_text(const ASN1_TIME* t) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) {
    ERR_clear_error();
    return "?";
  }
  const std::string text = utc_text(tm);
  return text.empty() ? "?" : text;
}

PkeyPtr generate_key() {
  // For "EC" the variadic argument is the curve name.
  return PkeyPtr(openssl_check_ptr(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"),
                                   "EVP_PKEY_Q_keygen(EC, P-256)"));
}

// now + offset seconds, written into `t` (allocated when null).
ASN1_TIME* set_time(ASN1_TIME* t, std::time_t now, int64_t offset) {
  return openssl_check_ptr(
      X509_time_adj_ex(t, static_cast<int>(offset / kDay), static_cast<long>(offset % kDay), &now),
      "X509_time_adj_ex");
}

// ---- validation --------------------------------------------------------------

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// The node id names a directory under `dir`, so it must not climb out of it
// or land on the CA's.
void check_node_id(const std::string& node_id) {
  if (!valid_name(node_id) || node_id == "." || node_id == "..") {
    throw ConfigError("node id '" + node_id +
                      "' cannot name a certificate bundle; use 1..64 characters of "
                      "[A-Za-z0-9._-], other than '.' and '..'");
  }
  if (node_id == "ca" || node_id == kAdminName) {
    throw ConfigError("node id '" + node_id + "' collides with the " +
                      (node_id == "ca" ? "CA directory <dir>/ca" : "admin bundle <dir>/admin") +
                      "; rename the node in the topology");
  }
}

void check_identity(const NodeIdentity& id) {
  if (!id.admin) check_node_id(id.node_id);
  if (!valid_name(id.job)) {
    throw ConfigError("job '" + id.job + "' is invalid; use 1..64 characters of [A-Za-z0-9._-]");
  }
  if (!id.region.empty() && !valid_name(id.region)) {
    throw ConfigError("region '" + id.region + "' of node '" + id.node_id +
                      "' is invalid; use 1..64 characters of [A-Za-z0-9._-]");
  }
}

void check_window(std::chrono::seconds offset, std::chrono::seconds validity, const char* what) {
  if (validity.count() <= 0 || validity.count() > kMaxValidity) {
    throw ConfigError(std::string(what) + " validity of " + std::to_string(validity.count()) +
                      " s is out of range; use more than 0 and at most 100 years");
  }
  if (offset.count() < -kMaxValidity || offset.count() > kMaxValidity) {
    throw ConfigError(std::string(what) + " notBefore offset of " + std::to_string(offset.count()) +
                      " s is more than 100 years from now");
  }
}

// ---- the CA --------------------------------------------------------------------

X509Ptr parse_cert(const std::string& text, const fs::path& path, const std::string& what) {
  BioPtr bio = read_bio(text);
  X509* cert = PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr);
  if (cert == nullptr) {
    throw CryptoError(what + " " + path.string() +
                      " is not a PEM certificate: " + detail::openssl_error_string());
  }
  return X509Ptr(cert);
}

X509Ptr load_cert(const fs::path& path, const std::string& what) {
  return parse_cert(read_federation_file(path, what), path, what);
}

Ca load_ca(const fs::path& ca_dir) {
  Ca ca;
  const fs::path cert_path = ca_dir / "ca.pem";
  ca.cert_pem = read_federation_file(cert_path, "the CA certificate");
  ca.cert = parse_cert(ca.cert_pem, cert_path, "the CA certificate");
  const fs::path key_path = ca_dir / "ca.key";
  const SecretText key_text{read_federation_file(key_path, "the CA key")};
  BioPtr bio = read_bio(key_text.text);
  ca.key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (!ca.key) {
    throw CryptoError("the CA key " + key_path.string() + " is not an unencrypted PEM private " +
                      "key: " + detail::openssl_error_string());
  }
  if (X509_check_private_key(ca.cert.get(), ca.key.get()) != 1) {
    throw CryptoError("the CA key " + key_path.string() + " does not belong to " +
                      cert_path.string() + " (" + detail::openssl_error_string() +
                      "); restore both from the same backup");
  }
  if (X509_check_ca(ca.cert.get()) == 0) {
    throw CryptoError(cert_path.string() + " is not a CA certificate; point at the directory " +
                      "`fedwan certs init` wrote");
  }
  return ca;
}

// The job the CA was made for: its subject O is "fedwan <job>".
std::string ca_job(X509* ca_cert) {
  X509_NAME* name = openssl_check_ptr(X509_get_subject_name(ca_cert), "X509_get_subject_name");
  char buf[256] = {};
  const int n = X509_NAME_get_text_by_NID(name, NID_organizationName, buf, sizeof buf);
  const std::string o = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  if (o.rfind("fedwan ", 0) != 0 || o.size() <= 7) {
    throw CryptoError("the CA certificate's subject O is '" + o +
                      "', not 'fedwan <job>'; point at the directory `fedwan certs init` wrote");
  }
  return o.substr(7);
}

// ---- records -------------------------------------------------------------------

// The serials (first word of each line) of dir/ca/serial or revoked.txt.
std::set<std::string> record_serials(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string serial;
    if (words >> serial) out.insert(serial);
  }
  return out;
}

std::string read_record(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec) ? read_federation_file(path, "the record") : std::string();
}

void append_record(const fs::path& path, const std::string& serial, const std::string& node) {
  std::string text = read_record(path);
  if (!text.empty() && text.back() != '\n') text += '\n';
  write_file_atomic(path, text + serial + " " + node + "\n", kPublicMode);
}

// Issues one node with an already loaded CA. Each file is replaced atomically,
// the bundle as a whole is not: a node starting in between sees a mismatched
// key and certificate and refuses to start, it never runs with a wrong key.
// crl.pem is written last because a running node reloads its bundle when
// crl.pem changes, by then the rest is in place.
void issue_with(const fs::path& root, const Ca& ca, const std::string& crl_text,
                const NodeIdentity& id, const IssueOptions& o) {
  check_identity(id);
  check_window(o.not_before_offset, o.validity, "node certificate");
  const fs::path serial_file = root / "ca" / "serial";
  PkeyPtr key = generate_key();
  X509Ptr cert = make_node_certificate(id, key.get(), ca, record_serials(read_record(serial_file)),
                                       std::time(nullptr), o);
  append_record(serial_file, int_hex(X509_get0_serialNumber(cert.get())), id.node_id);

  const fs::path bundle = root / id.node_id;
  make_private_directory(bundle);
  write_file_atomic(bundle / "key.pem", key_pem(key.get()).text, kSecretMode);
  write_file_atomic(bundle / "cert.pem", cert_pem(cert.get()), kPublicMode);
  write_file_atomic(bundle / "ca.pem", ca.cert_pem, kPublicMode);
  write_file_atomic(bundle / "crl.pem", crl_text, kPublicMode);
}

}  // namespace ca_detail

using namespace ca_detail;

void provision_federation(const Topology& topology, const std::string& dir,
                          const IssueOptions& options, bool overwrite) {
  check_window(options.not_before_offset, options.validity, "node certificate");
  check_window(std::chrono::seconds(0), options.ca_validity, "CA certificate");
  const int64_t node_end = options.not_before_offset.count() + options.validity.count();
  if (node_end > ca_start(options) + options.ca_validity.count()) {
    throw ConfigError("node certificates valid for " +
                      std::to_string(options.validity.count() / kDay) +
                      " days would outlive the CA; ask for a shorter validity (--days)");
  }
  std::vector<NodeIdentity> ids;
  for (const NodeSpec& n : topology.nodes()) {
    ids.push_back(identity_for(topology, n.id));
    check_identity(ids.back());  // all of them before anything is written
  }
  const fs::path root(dir);
  const fs::path ca_dir = root / "ca";
  std::error_code ec;
  std::vector<fs::path> existing;
  if (fs::exists(ca_dir, ec)) existing.push_back(ca_dir);
  if (fs::exists(root / kAdminName, ec)) existing.push_back(root / kAdminName);
  for (const NodeIdentity& id : ids) {
    if (fs::exists(root / id.node_id, ec)) existing.push_back(root / id.node_id);
  }
  if (!existing.empty()) {
    if (!overwrite) {
      throw ConfigError(existing.front().string() + " already exists: " + dir +
                        " holds a provisioned federation. Choose another output directory, or "
                        "overwrite (--force) to replace its CA and every bundle; certificates "
                        "from the old CA then stop verifying");
    }
    fs::remove_all(ca_dir, ec);  // the old CA's records and CRL mean nothing to the new one
    if (ec) throw_file_error("remove the old CA directory", ca_dir, ec.value());
  }
  make_private_directory(ca_dir);

  const std::time_t now = std::time(nullptr);
  Ca ca;
  ca.key = generate_key();
  ca.cert = make_ca_certificate(topology.job(), ca.key.get(), now, options);
  ca.cert_pem = cert_pem(ca.cert.get());
  write_file_atomic(ca_dir / "ca.key", key_pem(ca.key.get()).text, kSecretMode);
  write_file_atomic(ca_dir / "ca.pem", ca.cert_pem, kPublicMode);
  CrlPtr crl = sign_crl(ca, nullptr, nullptr, now, options.crl_validity.count());
  const std::string crl_text = crl_pem(crl.get());
  write_file_atomic(ca_dir / "crl.pem", crl_text, kPublicMode);
  write_file_atomic(ca_dir / "revoked.txt", "", kPublicMode);
  write_file_atomic(ca_dir / "serial", int_hex(X509_get0_serialNumber(ca.cert.get())) + " ca\n",
                    kPublicMode);
  for (const NodeIdentity& id : ids) issue_with(root, ca, crl_text, id, options);
  issue_with(root, ca, crl_text, admin_identity(topology.job()), options);
}

NodeIdentity admin_identity(const std::string& job) {
  NodeIdentity id;
  id.node_id = kAdminName;
  id.job = job;
  id.admin = true;
  return id;
}

void issue_admin(const std::string& dir, const IssueOptions& options) {
  const fs::path root(dir);
  const Ca ca = load_ca(root / "ca");
  const std::string crl_text = load_crl_text(root / "ca", ca.cert.get());
  issue_with(root, ca, crl_text, admin_identity(ca_job(ca.cert.get())), options);
}

void issue_node(const std::string& dir, const NodeIdentity& identity, const IssueOptions& options) {
  check_identity(identity);
  const fs::path root(dir);
  const Ca ca = load_ca(root / "ca");
  const std::string crl_text = load_crl_text(root / "ca", ca.cert.get());
  issue_with(root, ca, crl_text, identity, options);
}

NodeIdentity identity_for(const Topology& topology, const std::string& node_id) {
  const NodeSpec* n = topology.find(node_id);
  if (n == nullptr) {
    throw ConfigError("node '" + node_id + "' is not in the topology of job '" + topology.job() +
                      "'; use one of the node ids the topology lists");
  }
  NodeIdentity id;
  id.node_id = n->id;
  id.role = n->role;
  id.job = topology.job();
  switch (n->role) {
    case Role::kRoot: break;
    case Role::kRegion: id.region = n->id; break;
    case Role::kSite: id.region = n->parent; break;
  }
  return id;
}

}  // namespace fedwan::security
