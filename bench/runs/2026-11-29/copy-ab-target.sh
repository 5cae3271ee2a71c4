#!/bin/bash
# A/B of copy, cold cache, alternating two binaries on the same kept bench source, into a
# target directory under TARGET_PARENT (another device: /dev/shm).
# Usage: copy-ab-target.sh SCRATCH TARGET_PARENT A_BINARY B_BINARY [ROUNDS]
S=$1; P=$2; A=$3; B=$4; ROUNDS=${5:-3}
U=$(stat -c %U $S/repo-copy-src)
for round in $(seq 1 $ROUNDS); do
 for v in A B; do
  if [ $v = A ]; then BIN=$A; else BIN=$B; fi
  T=$P/ab-target; rm -rf $T; mkdir -p $T; chown -R $U $T
  sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
  /usr/bin/time -f "%e s, user %U, sys %S, peak %M KB" -o $S/ab.time runuser -u $U -- env PGSTRATA_REPO2_PATH=$T $BIN --config=$S/copy-src.conf --stanza=bench --repo=2 --from-repo=1 --lock-path=$S/lock copy > /dev/null 2>$S/ab.err || { cat $S/ab.err; exit 1; }
  echo "$v round $round: $(cat $S/ab.time), $(du -sb $T | cut -f1) bytes"
 done
done
rm -rf $P/ab-target
