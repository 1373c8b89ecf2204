#!/bin/bash
# usage: meas.sh LIB(tcp|build dir) clients n [test] -> one line: rps p99 cpu/req and per-request event counts
B=$1; C=$2; N=$3; T=${4:-get}
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
O=$(mktemp -d)
if [ "$B" = tcp ]; then PRE=""; else PRE="$B/bin/sdp run --"; fi
EV=raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_pwait2,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_sched_yield,syscalls:sys_enter_getpid,syscalls:sys_enter_kill,context-switches,task-clock
$PRE redis-server --port $PORT --bind 127.0.0.1 --save "" --appendonly no --protected-mode no --dir $O >$O/srv.log 2>&1 &
SP=$!
for i in $(seq 50); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
SPID=$(redis-cli -p $PORT info server | grep process_id | tr -dc 0-9)
perf stat -x, -e $EV -p $SPID -o $O/srv.stat &
PP=$!
sleep 0.1
$PRE perf stat -x, -e $EV -o $O/cli.stat timeout 60 redis-benchmark -p $PORT -c $C -n $N -t $T --csv > $O/out.csv 2>&1
kill -INT $PP; wait $PP
redis-cli -p $PORT shutdown nosave >/dev/null 2>&1; wait $SP 2>/dev/null
python3 - "$O" "$N" "$B" "$C" "$T" <<'PY'
import sys,csv
o,n,b,c,t=sys.argv[1],int(sys.argv[2]),sys.argv[3],sys.argv[4],sys.argv[5]
def st(f):
    d={}
    for line in open(f):
        p=line.strip().split(',')
        if len(p)>3 and p[0] and p[0][0].isdigit():
            d[p[2].split(':')[-1].replace('sys_enter_','')]=float(p[0])
    return d
rps=p99='?'
for line in open(o+'/out.csv'):
    p=[x.strip('"') for x in line.strip().split(',')]
    if p[0] in('GET','SET'): rps,p99=float(p[1]),float(p[6])
s=st(o+'/srv.stat'); cl=st(o+'/cli.stat')
def fmt(d):
    return ' '.join(f"{k.replace('epoll_','e')[:6]}={d.get(k,0)/n:.2f}" for k in ['sys_enter','read','write','sendto','recvfrom','epoll_pwait2','epoll_wait','epoll_ctl','sched_yield','getpid','kill','context-switches'])
lab='tcp' if b=='tcp' else ('base' if 'base' in b else 'new')
print(f"{lab:6} c={c} {t} rps={rps:9.0f} p99={p99:6.2f} cpu/req us: srv={s.get('task-clock',0)*1e3/n:.2f} cli={cl.get('task-clock',0)*1e3/n:.2f} tot={(s.get('task-clock',0)+cl.get('task-clock',0))*1e3/n:.2f}")
print("   srv/req:",fmt(s)); print("   cli/req:",fmt(cl))
PY
rm -rf $O
