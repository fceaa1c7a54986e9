// fedwan: run one node of a federation, or a whole demo federation.
#include "cli/commands.hpp"

int main(int argc, char** argv) { return fedwan::cli::run(argc, argv); }
