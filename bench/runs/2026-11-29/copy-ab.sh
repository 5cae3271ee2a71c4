#!/bin/bash
# A/B of copy to a local repository: old (fsync per pack) vs new (staged + syncfs).
S=/tmp/pgstrata-bench-copy-9057-0
for round in 1 2 3; do
 for v in old new; do
  if [ $v = old ]; then B=/work/target-old/debug/pgstrata; else B=/work/main/target/debug/pgstrata; fi
  T=$S/ab-target; rm -rf $T; mkdir -p $T; chown -R $(stat -c %U $S/repo-copy-src) $T
  find $S/repo-copy-src -type f -exec cat {} + > /dev/null; sync; sleep 1
  start=$(date +%s.%N)
  runuser -u $(stat -c %U $S/repo-copy-src) -- env PGSTRATA_REPO2_PATH=$T $B --config=$S/copy-src.conf --stanza=bench --repo=2 --from-repo=1 --lock-path=$S/lock copy > /dev/null 2>$S/ab.err || { cat $S/ab.err; exit 1; }
  end=$(date +%s.%N)
  echo "$v round $round: $(echo "$end - $start" | bc) s, $(du -sb $T | cut -f1) bytes"
 done
done
