"""Pipeline parallelism over the `pp` mesh axis: the 1F1B and interleaved schedules, stage p2p."""
