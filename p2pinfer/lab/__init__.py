"""The lab: benchmark drivers, test node processes, faulty peers, fuzzers and network testbeds. The node never imports it."""
