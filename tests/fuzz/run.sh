#!/usr/bin/env bash
# make fuzz: build the fuzzers (clang) into DIR and run each for SECONDS,
# keeping a growing corpus in DIR/corpus-TARGET (seeded from the committed
# tests/fuzz/corpus/*). Stops at the first failure and names its input.
# To fold new finds into the committed corpus (keep it small):
#   DIR/fuzz/fuzz_ring -merge=1 tests/fuzz/corpus/ring DIR/corpus-fuzz_ring
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build/fuzz}
secs=${2:-300}
targets=${3:-fuzz_hello fuzz_ring fuzz_policy}
cmake -S . -B "$dir" -DSDP_FUZZ=ON -DCMAKE_C_COMPILER=clang \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$dir" -j "$(nproc)"
for t in $targets; do
    corpus="$dir/corpus-$t"
    art="$dir/artifacts/$t"
    mkdir -p "$corpus" "$art"
    echo "== $t: $secs s (corpus $corpus, failures in $art)"
    "$dir/fuzz/$t" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$art/" \
        "$corpus" "tests/fuzz/corpus/${t#fuzz_}" 2>"$dir/$t.log" || {
        grep -v '^#' "$dir/$t.log" | tail -60
        echo "$t FAILED (log $dir/$t.log)"
        exit 1
    }
    grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$dir/$t.log" || true
done
echo "fuzz: no crash, hang or broken invariant"
