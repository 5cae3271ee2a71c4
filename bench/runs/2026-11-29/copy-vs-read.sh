#!/bin/bash
# The issue-43 ratio, measured in alternation so that the noise of a shared machine falls
# on both sides: per round, a cold-cache plain read (`cat` of every source object) and a
# cold-cache read with direct I/O (dd iflag=direct: the disk alone), and a
# cold-cache copy of the same objects by each binary into a target under TARGET_PARENT
# (another device: /dev/shm).
# Usage: copy-vs-read.sh SCRATCH TARGET_PARENT ROUNDS NAME=BINARY...
S=$1; P=$2; ROUNDS=$3; shift 3
U=$(stat -c %U $S/repo-copy-src)
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; }
for round in $(seq 1 $ROUNDS); do
  cold
  /usr/bin/time -f "%e" -o $S/read.time sh -c "find $S/repo-copy-src -type f -print0 | xargs -0 cat > /dev/null"
  read_s=$(cat $S/read.time)
  cold
  /usr/bin/time -f "%e" -o $S/direct.time sh -c "find $S/repo-copy-src -type f -exec sh -c 'for f; do dd if=\"\$f\" of=/dev/null bs=4M iflag=direct status=none; done' sh {} +"
  direct_s=$(cat $S/direct.time)
  echo "round $round: plain read $read_s s; with direct I/O $direct_s s"
  for nb in "$@"; do
    name=${nb%%=*}; bin=${nb#*=}
    T=$P/ab-target; rm -rf $T; mkdir -p $T; chown -R $U $T
    cold
    /usr/bin/time -f "%e %U %S %M" -o $S/ab.time runuser -u $U -- env PGSTRATA_REPO2_PATH=$T $bin --config=$S/copy-src.conf --stanza=bench --repo=2 --from-repo=1 --lock-path=$S/lock copy > /dev/null 2>$S/ab.err || { cat $S/ab.err; exit 1; }
    read e u s m < $S/ab.time
    echo "round $round: $name copy $e s (user $u, sys $s, peak $((m / 1024)) MB), $(du -sb $T | cut -f1) bytes: $(echo "scale=2; $read_s / $e" | bc)x the plain read's rate, $(echo "scale=2; $direct_s / $e" | bc)x the direct read's"
  done
done
rm -rf $P/ab-target
