#!/bin/bash
# usage: ab.sh LABEL LIB(tcp|build dir) clients n -> one line: label clients set_rps get_rps get_p99 cpu_us_per_req(srv cli total)
L=$1; B=$2; C=$3; N=$4
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
O=$(mktemp -d)
if [ "$B" = tcp ]; then PRE=""; else PRE="$B/bin/sdp run --"; fi
$PRE redis-server --port $PORT --bind 127.0.0.1 --save "" --appendonly no --protected-mode no --dir $O >$O/srv.log 2>&1 &
SP=$!
for i in $(seq 50); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
SPID=$(redis-cli -p $PORT info server | grep process_id | tr -dc 0-9)
s0=$(awk '{print $14+$15}' /proc/$SPID/stat)
/usr/bin/time -o $O/time -f "%U %S" $PRE timeout 60 redis-benchmark -p $PORT -c $C -n $N -d 64 -t set,get --csv > $O/out.csv 2>&1
s1=$(awk '{print $14+$15}' /proc/$SPID/stat)
redis-cli -p $PORT shutdown nosave >/dev/null 2>&1; wait $SP 2>/dev/null
python3 - "$O" "$N" "$L" "$C" "$((s1-s0))" <<'PY'
import sys
o,n,l,c,st=sys.argv[1],int(sys.argv[2]),sys.argv[3],sys.argv[4],int(sys.argv[5])
v={}
for line in open(o+'/out.csv'):
    p=[x.strip('"') for x in line.strip().split(',')]
    if p[0] in('GET','SET'): v[p[0]]=(float(p[1]),float(p[6]))
u,s=map(float,open(o+'/time').read().split()[-2:])
srv=st/100.0; cli=u+s
print(f"{l} {c} {v.get('SET',(0,0))[0]:.0f} {v.get('SET',(0,0))[1]:.3f} {v.get('GET',(0,0))[0]:.0f} {v.get('GET',(0,0))[1]:.3f} {srv*1e6/(2*n):.2f} {cli*1e6/(2*n):.2f} {(srv+cli)*1e6/(2*n):.2f}")
PY
rm -rf $O
