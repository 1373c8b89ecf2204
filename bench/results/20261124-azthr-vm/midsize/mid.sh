#!/bin/bash
# AZ around the refined threshold: stream of SIZE-byte sends, 0.3 s, pinned,
# configurations interleaved, 3 repetitions.
cd "$(dirname "$0")/../../../.."   # the repository root
export SDP_CALIB_FILE=/tmp/azthr/calib
P=build/bin/sdp-perf
run() { # name env size
  local name=$1 envs=$2 size=$3
  local out=$(mktemp)
  env $envs build/bin/sdp run -- taskset -c 0 $P server --bind 127.0.0.1 --port 0 --sessions 1 --timeout 20 > $out 2>/dev/null &
  local spid=$!
  for i in $(seq 100); do grep -q listening $out && break; sleep 0.05; done
  local port=$(grep -o '"port": *[0-9]*' $out | head -1 | grep -o '[0-9]*$')
  local res=$(env $envs build/bin/sdp run -- taskset -c 1 $P stream --host 127.0.0.1 --port $port --size $size --time 0.3 2>/dev/null | grep '"role": *"client"' | tail -1)
  wait $spid 2>/dev/null
  echo "$size $name $(echo "$res" | grep -o '"gbps":[0-9.]*' | cut -d: -f2) az=$(echo "$res" | grep -o '"tx_azcopy_bytes":[0-9]*' | cut -d: -f2) cpu=$(echo "$res" | grep -o '"per_s":[0-9.]*' | head -1 | cut -d: -f2)"
  rm -f $out
}
for size in 131072 163840 196608; do
 for rep in 1 2 3; do
  run bcopy-sync "SDP_ZCOPY_THRESH=auto" $size
  run zcopy-all "SDP_ZCOPY_THRESH=1" $size
  run az-auto "SDP_AZCOPY=1" $size
  run az-forced "SDP_AZCOPY=1 SDP_AZCOPY_THRESH=65536" $size
 done
done
