#!/bin/bash
# A/B of copy to a local repository, cold cache: old (staged through the page cache)
# vs new (staged with O_DIRECT), alternating on the same kept bench source.
# Usage: copy-ab-direct.sh SCRATCH OLD_BINARY NEW_BINARY [ROUNDS]
S=$1; OLD=$2; NEW=$3; ROUNDS=${4:-3}
U=$(stat -c %U $S/repo-copy-src)
for round in $(seq 1 $ROUNDS); do
 for v in old new; do
  if [ $v = old ]; then B=$OLD; else B=$NEW; fi
  T=$S/ab-target; rm -rf $T; mkdir -p $T; chown -R $U $T
  sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
  start=$(date +%s.%N)
  runuser -u $U -- env PGSTRATA_REPO2_PATH=$T /usr/bin/time -f "%M KB" -o $S/ab.rss $B --config=$S/copy-src.conf --stanza=bench --repo=2 --from-repo=1 --lock-path=$S/lock copy > /dev/null 2>$S/ab.err || { cat $S/ab.err; exit 1; }
  end=$(date +%s.%N)
  echo "$v round $round: $(echo "$end - $start" | bc) s, $(du -sb $T | cut -f1) bytes, peak $(cat $S/ab.rss)"
 done
done
