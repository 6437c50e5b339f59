"""Real msgbus sites, brokers and harnesses on one machine, for the demo, the benchmarks and the tests."""
