// Time to bring up one secure link: the full mutual TLS 1.3 handshake
// (ECDHE P-256, ECDSA P-256 certificates both ways, CRL checks), key export
// and the parent's sealed confirmation, with both ends in one thread and the
// messages passed in memory, so network latency is excluded. Over a WAN add
// two round trips (the handshake is 2-RTT from the child's first byte).
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>

#include "security/authorization.hpp"
#include "security/certs.hpp"
#include "transport/secure_channel.hpp"

namespace {

namespace fs = std::filesystem;
using namespace fedwan;

struct Federation {
  Topology topo = Topology::parse(R"(job: bench-tls
nodes:
  - {id: root, role: root, endpoint: "ipc:///tmp/bench-tls-root"}
  - {id: site, role: site, parent: root}
)");
  fs::path dir =
      fs::temp_directory_path() / ("fedwan-bench-tls-" + std::to_string(std::random_device{}()));
  std::shared_ptr<security::TlsContext> root_tls, site_tls;
  Federation() {
    security::provision_federation(topo, dir.string());
    root_tls = std::make_shared<security::TlsContext>((dir / "root").string());
    site_tls = std::make_shared<security::TlsContext>((dir / "site").string());
  }
  ~Federation() { fs::remove_all(dir); }

  transport::SecureChannelConfig config(bool client, security::AeadAlgorithm cipher) const {
    transport::SecureChannelConfig c;
    c.tls = client ? site_tls : root_tls;
    c.cipher = cipher;
    c.job_id = topo.job_id();
    const NodeSpec* self = &topo.node(client ? "site" : "root");
    c.self_index = self->index;
    const Topology* t = &topo;
    if (client) {
      c.authorize = [t, self](const security::NodeIdentity& cert, const std::string&) {
        return security::authorize_parent(*t, *self, cert);
      };
    } else {
      c.authorize = [t, self](const security::NodeIdentity& cert, const std::string& claimed) {
        return security::authorize_child(*t, *self, cert, claimed);
      };
    }
    return c;
  }
};

const Federation& federation() {
  static const Federation f;
  return f;
}

void deliver_all(transport::SecureChannel& to, transport::SecurityReplies& in,
                 transport::SecurityReplies* out) {
  for (auto& m : in) {
    size_t n = 0;
    std::string why;
    (void)to.receive(m.data(), m.size(), &n, &why, out);
  }
  in.clear();
}

void BM_Handshake(benchmark::State& state) {
  const auto cipher = static_cast<security::AeadAlgorithm>(state.range(0));
  const Federation& f = federation();
  const transport::SecureChannelConfig cc = f.config(true, cipher), pc = f.config(false, cipher);
  for (auto _ : state) {
    transport::SecureChannel child(cc, true, "root");
    transport::SecureChannel parent(pc, false, "site");
    transport::SecurityReplies up, down;
    child.start(&up);
    while (!up.empty() || !down.empty()) {
      deliver_all(parent, up, &down);
      deliver_all(child, down, &up);
    }
    if (!child.established() || !parent.established()) {
      state.SkipWithError(("handshake failed: " + child.failure()).c_str());
      break;
    }
  }
  state.SetLabel(security::aead_name(cipher));
}
BENCHMARK(BM_Handshake)
    ->Name("Handshake/MutualTls13")
    ->Arg(static_cast<int>(security::AeadAlgorithm::kAes256Gcm))
    ->Arg(static_cast<int>(security::AeadAlgorithm::kChaCha20Poly1305))
    ->Unit(benchmark::kMillisecond);

}  // namespace
