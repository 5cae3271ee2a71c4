#!/bin/bash
# One instant restore trial on a kept bench repository: pgbench -S windows while hydrating.
# Usage: hydrate-trial.sh SCRATCH BINARY LABEL [ENV...]
S=$1; BIN=$2; L=$3; shift 3
PGB=/usr/lib/postgresql/15/bin
T=$S/trial; rm -rf $T; mkdir -p $T; chown postgres $T
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
as() { runuser -u postgres -- "$@"; }
t0=$(date +%s.%N)
as env "$@" $BIN --config=$S/instant-0.conf --stanza=bench --pg-path=$T/pgdata --type=immediate --target-action=promote --instant restore > $T/restore.out 2>&1 || { cat $T/restore.out; exit 1; }
as $PGB/pg_ctl -D $T/pgdata -l $T/pg.log -o "-p 5999 -k $T -c listen_addresses= -c archive_mode=off" -w start > /dev/null || { tail $T/pg.log; exit 1; }
out=""
for w in $(seq 1 ${WINDOWS:-3}); do
  as $PGB/pgbench -n -S -c 2 -j 2 -T 3 -P 1 -p 5999 -h $T postgres > $T/pgb.out 2>&1
  tps=$(grep -oP "tps = \K[0-9.]+" $T/pgb.out | head -1)
  [ $w = 1 ] && prog=$(grep -oP "progress: \K[0-9.]+ s, [0-9.]+" $T/pgb.out | sed 's/ s, /s:/' | cut -d. -f1,2 | tr '\n' ' ')
  st=$(as $BIN instant-status --pg-path=$T/pgdata --output=json 2>/dev/null | python3 -c "import json,sys; s=json.load(sys.stdin); print(round(100*s['bytes_local']/max(1,s['bytes_total'])), s['state'])" 2>/dev/null)
  out="$out w$w ${tps%.*} ($st)"
done
as $BIN instant-status --pg-path=$T/pgdata --wait --output=json > $T/st.json
od=$(python3 -c "import json; s=json.load(open('$T/st.json')); print(s['on_demand_fetches'], 'on-demand', round(s['on_demand_latency_ms'],2), 'ms avg', s['on_demand_max_latency_ms'], 'max')")
t1=$(date +%s.%N)
ref=$(as $PGB/pgbench -n -S -c 2 -j 2 -T 3 -p 5999 -h $T postgres 2>&1 | grep -oP "tps = \K[0-9.]+" | head -1)
echo "$L:$out; hydrated at $(echo "$t1 - $t0" | bc | cut -c1-5) s; after: ${ref%.*}; $od; w1 per s: $prog"
as $PGB/pg_ctl -D $T/pgdata -m fast -w stop > /dev/null
for m in $(grep -o "$T[^ ]*mnt" /proc/mounts); do as fusermount3 -u -z $m; done
grep EXP $S/log/*instant* | tail -1; sleep 1; rm -rf $T
