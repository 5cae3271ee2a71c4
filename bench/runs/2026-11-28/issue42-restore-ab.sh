#!/bin/bash
# A/B: full restore of an incremental, pre-42 (bin-after, 0359563) vs post-42 (bin-now, 838277f).
set -e
D=/work/perf42/data; R=/work/perf42/repo; B=/usr/lib/postgresql/15/bin
rm -rf $D $R /work/perf42/t; mkdir -p $R /work/perf42/t; chown -R postgres $R /work/perf42
export PGSTRATA_STANZA=p42 PGSTRATA_REPO_PATH=$R PGSTRATA_PG_PATH=$D PGSTRATA_PG_HOST=/tmp PGSTRATA_PG_PORT=55442 PGSTRATA_PG_USER=postgres PGSTRATA_STATE_PATH=/work/perf42/state PGSTRATA_LOCK_PATH=/work/perf42/lock PGSTRATA_LOG_PATH=/work/perf42/log
U="runuser -u postgres --preserve-environment --"
$U $B/initdb -D $D >/dev/null
cat >> $D/postgresql.conf <<CONF
port=55442
unix_socket_directories='/tmp'
archive_mode=on
archive_command='/work/bin-now/pgstrata archive-push %p'
CONF
$U $B/pg_ctl -D $D -l /work/perf42/pg.log -w start >/dev/null
$U $B/pgbench -h /tmp -p 55442 -i -s 50 -q postgres 2>/dev/null
$U /work/bin-now/pgstrata stanza-create >/dev/null
$U /work/bin-now/pgstrata --start-fast --type=full backup >/dev/null
$U $B/psql -h /tmp -p 55442 -qc "UPDATE pgbench_accounts SET abalance=abalance+1 WHERE aid % 100 = 0" postgres
$U /work/bin-now/pgstrata --start-fast --type=incr backup
for i in 1 2 3 4 5; do
  for bin in after now; do
    rm -rf /work/perf42/t/d; mkdir -p /work/perf42/t/d; chown postgres /work/perf42/t/d; sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    /usr/bin/time -f "$bin wall %e user %U sys %S rss_kb %M" $U /work/bin-$bin/pgstrata --pg-path=/work/perf42/t/d --archive-mode=off restore >/dev/null 2>>/work/perf42/times.txt || echo "$bin failed" >> /work/perf42/times.txt
  done
done
$U $B/pg_ctl -D $D -w stop >/dev/null
