"""Benchmark suite for SDP (see docs/BENCHMARKS.md)."""
SCHEMA_VERSION = "sdp-bench/1"
