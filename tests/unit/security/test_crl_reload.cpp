// A node takes a new CRL when its content changes, whatever the file's size
// and time say: operators' tools (`cp -p`, `rsync -t`) keep the old time,
// and a CRL re-signed with the same revocations may have the old size.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/atomic_file.hpp"
#include "harness/temp_dir.hpp"
#include "security/certs.hpp"
#include "security/tls_session.hpp"

namespace fedwan::security {
namespace {

namespace fs = std::filesystem;

TEST(CrlReload, ANewCrlWithTheOldSizeAndTimeIsTaken) {
  const testing::TempDir dir;
  const Topology topo = Topology::parse(R"(job: crl-reload
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/crl-reload-root"}
  - {id: site-a, role: site, parent: root}
  - {id: site-b, role: site, parent: root}
)");
  const std::string pki = (dir / "pki").string();
  provision_federation(topo, pki);
  const fs::path crl = fs::path(pki) / "root" / "crl.pem";
  std::string before = read_file(crl);
  TlsContext ctx((fs::path(pki) / "root").string());
  EXPECT_FALSE(ctx.reload_crl_if_changed());  // nothing changed

  revoke_node(pki, "site-b");  // writes the new CRL into every bundle
  std::string after = read_file(crl);
  ASSERT_NE(before, after);
  // The same size (PEM ends at its END line; what follows is ignored) and time.
  if (after.size() < before.size()) after += std::string(before.size() - after.size(), '\n');
  if (before.size() < after.size()) before += std::string(after.size() - before.size(), '\n');
  write_file_atomic(crl, before, 0644);
  const auto when = fs::last_write_time(crl);
  TlsContext same((fs::path(pki) / "root").string());
  write_file_atomic(crl, after, 0644);
  fs::last_write_time(crl, when);
  EXPECT_TRUE(same.reload_crl_if_changed());
  EXPECT_EQ(same.crl_problem(), "");
  EXPECT_FALSE(same.reload_crl_if_changed());  // taken once

  // A file that cannot be used leaves the last good CRL in force, and the
  // good one coming back is taken again.
  write_file_atomic(crl, "-----BEGIN X509 CRL-----\ntorn", 0644);
  EXPECT_FALSE(same.reload_crl_if_changed());
  EXPECT_NE(same.crl_problem(), "");
  write_file_atomic(crl, after, 0644);
  EXPECT_TRUE(same.reload_crl_if_changed());
  EXPECT_EQ(same.crl_problem(), "");
}

}  // namespace
}  // namespace fedwan::security
