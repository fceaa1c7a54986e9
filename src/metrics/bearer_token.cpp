#include "metrics/bearer_token.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <iterator>

#include "common/errno_text.hpp"
#include "common/sha256.hpp"
#include "fedwan/error.hpp"

namespace fedwan::metrics {
namespace {

constexpr size_t kMaxTokenFileBytes = 4096;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

}  // namespace

std::string read_bearer_token_file(const std::string& path) {
  const auto bad = [&](const std::string& why) {
    return ConfigError("metrics token file " + path + ": " + why);
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw bad("cannot read it: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw bad("is not a regular file");
  if ((st.st_mode & S_IRWXO) != 0) {
    throw bad("others may read or write it (chmod o-rwx, e.g. chmod 0400, or a Secret volume "
              "with defaultMode: 0400)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad("cannot open it");
  std::string text;
  text.resize(kMaxTokenFileBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxTokenFileBytes) throw bad("is larger than 4 KiB: not a token");
  size_t b = 0, e = text.size();
  while (b < e && is_space(text[b])) ++b;
  while (e > b && is_space(text[e - 1])) --e;
  std::string token = text.substr(b, e - b);
  if (token.empty()) throw bad("is empty (put a random token in it, e.g. openssl rand -hex 32)");
  for (const char c : token) {
    if (c <= 0x20 || c >= 0x7f) {
      throw bad("holds whitespace or a character outside printable ASCII inside its token");
    }
  }
  if (token.size() < kMinBearerTokenBytes) {
    throw bad("holds a token of " + std::to_string(token.size()) + " characters; use at least " +
              std::to_string(kMinBearerTokenBytes) + " (e.g. openssl rand -hex 32)");
  }
  return token;
}

bool bearer_token_matches(std::string_view authorization, const std::string& token) {
  constexpr std::string_view kScheme = "bearer ";
  if (token.empty() || authorization.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    const char c = authorization[i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != kScheme[i]) return false;
  }
  std::string_view given = authorization.substr(kScheme.size());
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  while (!given.empty() && given.back() == ' ') given.remove_suffix(1);
  // Digests of both: equal lengths whatever was sent, so neither the
  // length nor the first differing byte shows in the time taken.
  const Sha256Digest a = sha256(given.data(), given.size());
  const Sha256Digest b = sha256(token.data(), token.size());
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace fedwan::metrics
