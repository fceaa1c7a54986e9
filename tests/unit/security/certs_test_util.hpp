// Shared by the certificate tests: owning pointers for OpenSSL objects and
// a certificate read from PEM.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <string>

#include "common/openssl_check.hpp"

namespace fedwan::security {

using detail::OpenSslPtr;
using X509Ptr = OpenSslPtr<X509, X509_free>;
using PkeyPtr = OpenSslPtr<EVP_PKEY, EVP_PKEY_free>;
using BioPtr = OpenSslPtr<BIO, BIO_free_all>;

inline X509Ptr cert_from(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace fedwan::security
