// Two sites train one small regression model together through a root
// aggregator, all in one process (one thread per node, ipc:// sockets). In a
// real deployment each node is its own process on its own machine, the
// topology comes from a YAML file (Topology::load) and the endpoints are tcp://.
//
// Exits 0 when the federated model fits both sites' data better than the
// initial model did and both sites ended with the same parameters.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <fedwan/aggregator.hpp>
#include <fedwan/flat_parameters.hpp>
#include <fedwan/security.hpp>
#include <fedwan/site.hpp>
#include <fedwan/topology.hpp>

namespace {

struct Dataset {
  torch::Tensor x, y;
};

// Every node must start from the same model: seed, then build.
torch::nn::Sequential make_model() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 1));
}

// y = x.w + 0.5 + noise, the same law everywhere, but each site sees inputs
// from its own region of the space (non-IID), so neither alone covers both.
Dataset make_site_data(int site, int64_t samples) {
  torch::manual_seed(100 + site);
  const torch::Tensor w = torch::tensor({1.0f, -2.0f, 0.5f, 3.0f}).view({4, 1});
  torch::Tensor x = torch::randn({samples, 4}) + (site == 0 ? -1.0 : 1.0);
  return {x, x.matmul(w) + 0.5 + 0.05 * torch::randn({samples, 1})};
}

double loss_on(torch::nn::Sequential& model, const std::vector<Dataset>& data) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const Dataset& d : data) sum += torch::mse_loss(model->forward(d.x), d.y).item<double>();
  return sum / static_cast<double>(data.size());
}

}  // namespace

int main() {
  torch::set_num_threads(1);  // two training threads already share the cores

  // Sockets live in a private directory, removed at the end.
  std::string tmpl = (std::filesystem::temp_directory_path() / "fedwan-example-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return 1;
  const std::filesystem::path dir = tmpl;
  auto endpoint = [&](const std::string& id) { return "ipc://" + (dir / (id + ".sock")).string(); };

  // The federation: a root with two sites under it. A site's weight is its
  // share in the average, here its number of samples.
  const std::vector<Dataset> data = {make_site_data(0, 192), make_site_data(1, 320)};
  fedwan::FederationSpec fed;
  fed.rounds = 6;
  fed.inner_steps = 5;       // H: local SGD steps between two syncs
  fed.codec = "fp16";        // deltas travel as fp16 (half the fp32 bytes)
  fed.round_timeout_s = 60;  // fail instead of waiting forever
  std::vector<fedwan::NodeSpec> nodes(3);
  nodes[0].id = "root";
  nodes[0].role = fedwan::Role::kRoot;
  nodes[0].endpoint = endpoint("root");
  for (int s = 0; s < 2; ++s) {
    nodes[s + 1].id = "site-" + std::to_string(s);
    nodes[s + 1].role = fedwan::Role::kSite;
    nodes[s + 1].parent = "root";
    nodes[s + 1].weight = static_cast<double>(data[s].x.size(0));
  }
  const fedwan::Topology topology = fedwan::Topology::build("two-sites", fed, nodes);
  // Every link is mutual TLS: a federation CA and one bundle per node (what
  // `fedwan certs init` does). In a deployment each node gets only its own.
  const std::string pki = (dir / "pki").string();
  fedwan::provision_credentials(topology, pki);

  // The root needs the initial model as one flat fp32 vector.
  torch::nn::Sequential initial = make_model();
  const double loss_before = loss_on(initial, data);
  fedwan::AggregatorOptions agg_opts;
  agg_opts.topology = topology;
  agg_opts.node_id = "root";
  agg_opts.join_timeout = std::chrono::seconds(30);  // every blocking call has a deadline
  agg_opts.security = fedwan::credentials_in(pki, "root");
  {
    fedwan::FlatParameters flat(*initial);
    agg_opts.initial_model.assign(flat.data(), flat.data() + flat.numel());
  }
  fedwan::AggregatorSummary summary;
  std::vector<std::string> errors(3);
  std::thread root([&] {
    try {
      fedwan::Aggregator aggregator(agg_opts);
      summary = aggregator.run();  // blocks until the last round
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });

  // Models are built here, on one thread, because the seed is process-wide.
  std::vector<torch::nn::Sequential> models = {make_model(), make_model()};
  std::vector<std::thread> sites;
  for (int s = 0; s < 2; ++s) {
    sites.emplace_back([&, s] {
      try {
        torch::nn::Sequential& model = models[s];
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
        fedwan::SiteOptions opts;
        opts.topology = topology;
        opts.node_id = nodes[s + 1].id;
        opts.join_timeout = std::chrono::seconds(30);
        opts.security = fedwan::credentials_in(pki, nodes[s + 1].id);
        // Flattens the parameters in place: model, optimizer and fedwan now
        // share one buffer, so a sync rewrites what the model computes with.
        fedwan::Site site(opts, *model, &optimizer);
        site.join();
        while (!site.finished()) {
          optimizer.zero_grad();
          torch::mse_loss(model->forward(data[s].x), data[s].y).backward();
          optimizer.step();
          site.step();  // every H-th call sends this site's delta and loads the new model
        }
      } catch (const std::exception& e) {
        errors[s + 1] = e.what();
      }
    });
  }
  for (std::thread& t : sites) t.join();
  root.join();
  std::filesystem::remove_all(dir);

  bool ok = true;
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].empty()) std::cerr << nodes[i].id << " failed: " << errors[i] << "\n";
    ok = ok && errors[i].empty();
  }
  if (!ok) return 1;

  // After the last round every site holds the same global model.
  const double loss_after = loss_on(models[0], data);
  std::cout << "rounds: " << summary.rounds << ", H = " << fed.inner_steps << "\n"
            << "loss on both sites' data: before " << loss_before << ", after " << loss_after
            << "\nWAN bytes: " << summary.wan_bytes_total << " (" << summary.fp32_bytes_total
            << " had the deltas been fp32)\n";
  if (!(loss_after < loss_before)) {
    std::cerr << "error: the loss did not go down\n";
    ok = false;
  }
  using torch::nn::utils::parameters_to_vector;
  if (!torch::equal(parameters_to_vector(models[0]->parameters()),
                    parameters_to_vector(models[1]->parameters()))) {
    std::cerr << "error: the sites ended with different parameters\n";
    ok = false;
  }
  return ok ? 0 : 1;
}
