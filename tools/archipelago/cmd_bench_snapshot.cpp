// archipelago bench snapshot (see cmd_bench_snapshot.hpp).
