#include "cli/workload_settings.hpp"

#include <CLI/CLI.hpp>

#include "cli/validators.hpp"

namespace fedwan::cli {

void add_workload_flags(CLI::App& app, WorkloadSettings& s) {
  app.add_option("--trainer", s.trainer, "what to train: fashion-cnn or synthetic")
      ->check(CLI::IsMember({"fashion-cnn", "synthetic"}))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "seed of the model, the data split and the shuffling")
      ->check(number_in(0, 9007199254740991.0))
      ->capture_default_str();
  app.add_option("--data", s.data_dir, "Fashion-MNIST directory")->capture_default_str();
  app.add_option("--alpha", s.alpha, "Dirichlet concentration of the non-IID split")
      ->check(number_in(1e-3, 1e6, /*integer=*/false))
      ->capture_default_str();
  app.add_option("--batch-size", s.batch_size, "minibatch size")
      ->check(number_in(1, 65536))
      ->capture_default_str();
  app.add_option("--inner-optimizer", s.inner_optimizer, "site optimizer: adam or sgd")
      ->check(CLI::IsMember({"adam", "sgd"}))
      ->capture_default_str();
  app.add_option("--lr", s.lr, "site learning rate")
      ->check(number_in(1e-12, 100, /*integer=*/false))
      ->capture_default_str();
  app.add_option("--synthetic-size", s.synthetic_size, "parameters of the synthetic model")
      ->check(number_in(1, 1 << 30))
      ->capture_default_str();
}

std::vector<std::string> workload_args(const WorkloadSettings& s) {
  return {"--trainer",
          s.trainer,
          "--seed",
          std::to_string(s.seed),
          "--data",
          s.data_dir,
          "--alpha",
          std::to_string(s.alpha),
          "--batch-size",
          std::to_string(s.batch_size),
          "--inner-optimizer",
          s.inner_optimizer,
          "--lr",
          std::to_string(s.lr),
          "--synthetic-size",
          std::to_string(s.synthetic_size)};
}

}  // namespace fedwan::cli
