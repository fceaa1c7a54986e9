"""fedwan's WAN benchmark harness: federations of real processes, one network
namespace per node, every tree edge an emulated WAN link (docs/benchmarks.md)."""
