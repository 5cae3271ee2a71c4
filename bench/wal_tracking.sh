#!/usr/bin/env bash
# bench/wal_tracking.sh: incremental backups that learn changed blocks from the WAL
# (pgstrata --track=wal), against hashing changed files (pgstrata --track=hash) and against
# pgBackRest 2.45's incremental, at several database sizes; and the cost of decoding WAL in
# archive-push.
#
# Usage:
#   bench/wal_tracking.sh [--scales LIST] [--copies N] [--rows-changed N] [--runs N]
#                         [--codec C] [--pgbr-bundle n|y] [--segments N] [--push-rounds N]
#                         [--verify] [--process-max N] [--port N] [--no-wait]
#                         [--workdir DIR] [--keep] [--no-build] [--pgstrata BIN] [--out FILE]
#
#   --scales LIST      pgbench scale factors, comma-separated, one database per scale
#                      (default 10,40,100; 1 scale = 100,000 rows, ~13 MB per large table)
#   --copies N         copies test1..testN of pgbench_accounts (default 1)
#   --rows-changed N   rows updated in every large table per change, spread evenly over the
#                      table so that every 1 GiB segment file is touched (default 100)
#   --runs N           change + incremental cycles per scale; each cycle changes other rows
#                      and takes one incremental per variant; best time is kept (default 2)
#   --codec C          compression of the backups, both tools, at the default level
#                      (default lz4: pgBackRest's fastest codec)
#   --pgbr-bundle n|y  pgBackRest repo1-bundle (default n, pgBackRest's default)
#   --segments N       WAL segments for the archive-push measurement (default 20; 0 skips it)
#   --push-rounds N    rounds of the archive-push measurement, best kept (default 3)
#   --verify           restore the last --track=wal incremental of every scale, start it
#                      (WAL replay via pgstrata archive-get) and compare table contents
#   --no-wait          do not wait for other benchmarks (bench/*.sh) to finish first
#   --process-max N, --port N (default 55452; N+1 for --verify), --workdir DIR, --keep,
#   --no-build, --pgstrata BIN, --out FILE: as in the other scripts
#
# What it does (seed 000's backup scenario with a small change in every large table; see
# bench/README.md, section wal_tracking.sh):
#   1. builds pgstrata; waits until no other benchmark (bench/incremental.sh, restore.sh,
#      bundling.sh, full_backup.sh, s3_latency.sh) runs, and checks again before every timed
#      phase;
#   2. per scale: initdb --data-checksums, PostgreSQL 15, pgbench -i -s SCALE, COPIES x
#      CREATE TABLE testI AS SELECT * FROM pgbench_accounts, VACUUM ANALYZE, CHECKPOINT (no
#      archiving yet); then three repositories: pgstrata "wal", pgstrata "hash" and
#      pgBackRest. The archive_command pushes every segment to all three (pgstrata's
#      archive-push writes the block-change map beside each segment);
#   3. a full backup into each repository (same data state: nothing changes in between);
#   4. per run: UPDATE of ROWS_CHANGED rows, evenly spread, in pgbench_accounts and in every
#      copy (so every relation segment file's mtime moves), VACUUM ANALYZE, CHECKPOINT, WAL
#      switched and archived; then an incremental into each repository, on the same state
#      (again nothing changes in between; the order alternates between runs):
#        pgstrata --type=incr --track=wal  (if it refuses, the error is reported and an
#                                           incremental with --track=auto is taken instead)
#        pgstrata --type=incr --track=hash
#        pgbackrest --type=incr            (file-level: a changed file is copied whole)
#      pgstrata's info --output=json gives track, track_reason, bytes_read, files_tracked,
#      stored_size; pgBackRest's gives repository.delta (stored) and delta (bytes copied);
#   5. archive-push: after the last scale, CHECKPOINT and pgbench TPC-B traffic until SEGMENTS
#      whole segments were written; they are fetched back with archive-get. Per round, into
#      fresh repositories (--compress-type=lz4): archive-push of each segment, one process
#      per segment like archive_command (decodes the WAL in a parallel thread and writes the
#      map), and archive-push of the same bytes named NAME.partial (archived without
#      decoding). Best wall time of each; the difference is the cost of decoding;
#   6. prints markdown tables.
#
# Requirements: run as root; PostgreSQL 15 in /usr/lib/postgresql/15/bin (or PG_BIN=...);
# pgbench; pgbackrest; jq; cargo (unless --no-build). Helpers: bench/lib.sh.

set -Eeuo pipefail

BENCH_NAME=wal_tracking.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------- options
bench_defaults
PORT=55452
SCALES="10,40,100"
COPIES=1
ROWS_CHANGED=100
RUNS=2
CODEC=lz4
PGBR_BUNDLE=n
SEGMENTS=20
PUSH_ROUNDS=3
VERIFY=0
WAIT=1
ARGS_LINE="$0 $*"

while [[ $# -gt 0 ]]; do
    bench_common_option "$@"
    if (( SHIFT_N )); then shift "$SHIFT_N"; continue; fi
    case "$1" in
        --scales) need_arg "$@"; SCALES="$2"; shift 2 ;;
        --scales=*) SCALES="${1#*=}"; shift ;;
        --copies) need_arg "$@"; COPIES="$2"; shift 2 ;;
        --copies=*) COPIES="${1#*=}"; shift ;;
        --rows-changed) need_arg "$@"; ROWS_CHANGED="$2"; shift 2 ;;
        --rows-changed=*) ROWS_CHANGED="${1#*=}"; shift ;;
        --runs) need_arg "$@"; RUNS="$2"; shift 2 ;;
        --runs=*) RUNS="${1#*=}"; shift ;;
        --codec) need_arg "$@"; CODEC="$2"; shift 2 ;;
        --codec=*) CODEC="${1#*=}"; shift ;;
        --pgbr-bundle) need_arg "$@"; PGBR_BUNDLE="$2"; shift 2 ;;
        --pgbr-bundle=*) PGBR_BUNDLE="${1#*=}"; shift ;;
        --segments) need_arg "$@"; SEGMENTS="$2"; shift 2 ;;
        --segments=*) SEGMENTS="${1#*=}"; shift ;;
        --push-rounds) need_arg "$@"; PUSH_ROUNDS="$2"; shift 2 ;;
        --push-rounds=*) PUSH_ROUNDS="${1#*=}"; shift ;;
        --verify) VERIFY=1; shift ;;
        --no-wait) WAIT=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

IFS=',' read -r -a SCALE_LIST <<< "$SCALES"
(( ${#SCALE_LIST[@]} > 0 )) || die "--scales is empty"
for sc in "${SCALE_LIST[@]}"; do
    is_uint "$sc" && (( sc >= 1 )) || die "--scales: '$sc' is not a positive integer"
done
is_uint "$COPIES" && (( COPIES >= 0 )) || die "--copies must be >= 0, got '$COPIES'"
is_uint "$ROWS_CHANGED" && (( ROWS_CHANGED >= 1 )) || die "--rows-changed must be >= 1, got '$ROWS_CHANGED'"
is_uint "$RUNS" && (( RUNS >= 1 )) || die "--runs must be >= 1, got '$RUNS'"
LEVEL=$(default_level "$CODEC") || die "unknown codec '$CODEC' (zst, lz4, gz, bz2, none)"
[[ "$PGBR_BUNDLE" == n || "$PGBR_BUNDLE" == y ]] || die "--pgbr-bundle must be n or y, got '$PGBR_BUNDLE'"
is_uint "$SEGMENTS" || die "--segments must be >= 0, got '$SEGMENTS'"
is_uint "$PUSH_ROUNDS" && (( PUSH_ROUNDS >= 1 )) || die "--push-rounds must be >= 1, got '$PUSH_ROUNDS'"
check_common_options

bench_prereqs
bench_binary

# --------------------------------------------------------------------- wait for other benches
OTHERS='bench/(incremental|restore|bundling|full_backup|s3_latency)\.sh'
WAITED=0
wait_idle() {   # what is about to be measured
    (( WAIT )) || return 0
    local w=0
    while pgrep -f "$OTHERS" >/dev/null; do
        (( w == 0 )) && log "waiting before $1: other benchmark running: $(pgrep -fa "$OTHERS" | cut -c1-120 | tr '\n' ';')"
        sleep 20; w=$((w + 20))
    done
    (( w > 0 )) && log "waited ${w}s for other benchmarks"
    WAITED=$((WAITED + w))
    if pgrep -f 'cargo (test|build|clippy|nextest)|/rustc --crate-name' >/dev/null 2>&1; then
        log "note: a cargo build/test is running on this machine during '$1' (noise)"
        NOISE_NOTES+=("a cargo build/test ran during: $1")
    fi
    return 0
}
NOISE_NOTES=()
wait_idle "the setup"

bench_workdir
T_START=$(now)

# ---------------------------------------------------------------------------------- helpers
# pgstrata backup that may fail: returns the exit status, sets LAST_SEC (and LAST_LABEL).
pgs_backup_try() {   # repo tag [extra args...]
    local repo="$1" tag="$2" t0 t1 rc=0
    shift 2
    settle
    t0=$(now)
    as_pg "$PGS" --stanza=$STANZA --repo-path="$repo" --pg-path="$SRC" \
        --pg-host="$SOCK" --pg-port="$PORT" --pg-user=postgres --log-path="$LOGDIR" \
        --compress-type="$CODEC" --compress-level="$LEVEL" --process-max="$PROCESS_MAX" \
        --start-fast "$@" backup >"$LOGDIR/pgstrata-backup-$tag.out" 2>"$LOGDIR/pgstrata-backup-$tag.err" || rc=$?
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
    (( rc == 0 )) || return "$rc"
    LAST_LABEL=$(grep -v '^[[:space:]]*$' "$LOGDIR/pgstrata-backup-$tag.out" | tail -n 1 | awk '{print $NF}')
    [[ -n "$LAST_LABEL" ]] || die "pgstrata backup printed no label ($LOGDIR/pgstrata-backup-$tag.out)"
}
pgs_backup_field() {   # json label field
    "$JQ" -r --arg l "$2" --arg f "$3" '(.backups // .[0].backups)[] | select(.label == $l) | .[$f] // "" | tostring' <<< "$1"
}
pgbr_backup_field() {   # json label jq-path
    "$JQ" -r --arg l "$2" ".[0].backup[] | select(.label == \$l) | $3" <<< "$1"
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.1f", 100 * a / b }'; }
# "x.y" seconds -> best; keyed arrays hold the best time per scale and variant.
declare -A BEST ALL_ROWS TRK TREASON TRACKED UNCH READ STORED PGBR_READ FULL_T FULL_S WAL_ERR
declare -A DBSIZE DATADIR TABLE_MB TOUCHED PGS_DBSIZE T L T_RUN
DETAIL_ROWS=()

# Evenly spread change: ROWS_CHANGED rows per large table, a different set per change.
apply_change() {   # change-number
    local n="$1" t step off args=()
    step=$((ROWS / ROWS_CHANGED)); (( step >= 1 )) || step=1
    off=$(( (1 + n * 7919) % step ))
    for t in "${TABLES[@]}"; do
        args+=(-c "WITH u AS (UPDATE $t SET abalance = abalance + 1 WHERE aid IN (SELECT 1 + k * $step + $off FROM generate_series(0, $((ROWS_CHANGED - 1))) k) RETURNING 1) SELECT count(*) FROM u")
    done
    log "change #$n: UPDATE of $ROWS_CHANGED rows (aid = 1 + k*$step + $off) in each of ${TABLES[*]}"
    psql_src -d postgres -At "${args[@]}" >"$LOGDIR/change-$n.out" || die "UPDATE failed"
    # every statement must have updated ROWS_CHANGED rows
    local bad
    bad=$(grep -c -v "^$ROWS_CHANGED\$" "$LOGDIR/change-$n.out" || true)
    (( bad == 0 )) || die "change #$n: not every UPDATE hit $ROWS_CHANGED rows: $(tr '\n' ' ' < "$LOGDIR/change-$n.out")"
}

# Relation files (all segments, main fork) of the large tables, and how many are newer than $1.
count_touched() {   # marker-file -> "touched/total"
    local t p f total=0 touched=0
    for t in "${TABLES[@]}"; do
        p=$(psql_src -d postgres -At -c "SELECT pg_relation_filepath('$t')")
        for f in "$SRC/$p" "$SRC/$p".[0-9]*; do
            [[ -f "$f" ]] || continue
            total=$((total + 1))
            [[ "$f" -nt "$1" ]] && touched=$((touched + 1))
        done
    done
    echo "$touched/$total"
}

stop_source() {
    if [[ -f "$SRC/postmaster.pid" ]]; then
        as_pg "$PG_BIN/pg_ctl" -D "$SRC" -m fast -w stop >/dev/null 2>&1 || die "stopping the source cluster failed"
    fi
}

# ------------------------------------------------------------------------- per-scale scenario
LAST_WAL_REPO=""
si=0
for scale in "${SCALE_LIST[@]}"; do
    s="s$scale"
    stop_source
    rm -rf "$SRC"
    clear_archive_targets
    init_source_cluster
    load_pgbench_and_copies "$scale" "$COPIES" test
    ROWS=$((scale * 100000))
    log "[$s] VACUUM ANALYZE, CHECKPOINT"
    psql_src -d postgres -c "VACUUM ANALYZE" || die "VACUUM ANALYZE failed"
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
    database_sizes
    DBSIZE[$s]=$DB_BYTES; DATADIR[$s]=$DATADIR_BYTES
    TABLE_MB[$s]=$(psql_src -d postgres -At -c "SELECT round(pg_relation_size('pgbench_accounts') / 1048576.0)")
    log "[$s] database size: $(mb "$DB_BYTES") MB; pgbench_accounts ${TABLE_MB[$s]} MB; ${#TABLES[@]} large tables"

    d="$RUNDIR/$s"
    mkdir -p "$d"; chown postgres:postgres "$d"
    conf="$d/pgbackrest.conf"
    write_pgbr_conf "$conf" "$d/repo-pgbackrest" "$CODEC" "$LEVEL" "$PGBR_BUNDLE"
    pgs_stanza_create "$d/repo-wal" "$s-wal"
    pgs_stanza_create "$d/repo-hash" "$s-hash"
    pgbr_stanza_create "$conf" "$s"
    set_archive_targets "$CODEC" "$LEVEL" "$d/repo-wal $d/repo-hash" "$conf"
    wal_switch_and_wait

    # ---- full backups (same state for all three)
    wait_idle "the full backups ($s)"
    for v in wal hash; do
        log "[$s] pgstrata full backup (repository $v)"
        pgs_backup_try "$d/repo-$v" "$s-$v-full" --type=full \
            || { tail -n 20 "$LOGDIR/pgstrata-backup-$s-$v-full.err" >&2; die "pgstrata full backup failed ($s $v)"; }
        FULL_T[$s,$v]=$LAST_SEC
        log "[$s] pgstrata full ($v): ${LAST_SEC}s, $LAST_LABEL"
    done
    log "[$s] pgbackrest full backup"
    time_pgbr_backup "$conf" "$s-full" full
    FULL_T[$s,pgbr]=$LAST_SEC
    PGBR_FULL_LABEL=$LAST_LABEL
    log "[$s] pgbackrest full: ${LAST_SEC}s, $LAST_LABEL"

    # ---- change + incrementals
    for ((run = 1; run <= RUNS; run++)); do
        tag="$s-r$run"
        marker="$WORKDIR/marker-$tag"
        as_pg touch "$marker"; sleep 1.1   # mtimes have 1 s resolution on some file systems
        apply_change "$((si * 100 + run))"
        log "[$tag] VACUUM ANALYZE, CHECKPOINT"
        psql_src -d postgres -c "VACUUM ANALYZE" || die "VACUUM ANALYZE failed"
        psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
        wal_switch_and_wait
        TOUCHED[$tag]=$(count_touched "$marker")
        log "[$tag] relation segment files of the large tables modified by the change: ${TOUCHED[$tag]}"
        if (( VERIFY )) && (( run == RUNS )); then record_source_check "after-$s"; fi

        order=(wal hash pgbr)
        (( (run + si) % 2 == 0 )) && order=(pgbr hash wal)
        wait_idle "the incrementals ($tag)"
        for v in "${order[@]}"; do
            case $v in
                wal)
                    log "[$tag] pgstrata incr --track=wal"
                    WAL_ERR[$tag]=""
                    if ! pgs_backup_try "$d/repo-wal" "$tag-wal" --type=incr --track=wal; then
                        WAL_ERR[$tag]=$(grep -v '^[[:space:]]*$' "$LOGDIR/pgstrata-backup-$tag-wal.err" | tail -n 3 | tr '\n' ' ')
                        log "[$tag] MISBEHAVIOUR: pgstrata --track=wal refused after ${LAST_SEC}s: ${WAL_ERR[$tag]}"
                        log "[$tag] taking the incremental with --track=auto instead"
                        pgs_backup_try "$d/repo-wal" "$tag-wal-auto" --type=incr --track=auto \
                            || { tail -n 20 "$LOGDIR/pgstrata-backup-$tag-wal-auto.err" >&2; die "pgstrata incr --track=auto failed ($tag)"; }
                    fi
                    T[$v]=$LAST_SEC; L[$v]=$LAST_LABEL ;;
                hash)
                    log "[$tag] pgstrata incr --track=hash"
                    pgs_backup_try "$d/repo-hash" "$tag-hash" --type=incr --track=hash \
                        || { tail -n 20 "$LOGDIR/pgstrata-backup-$tag-hash.err" >&2; die "pgstrata incr --track=hash failed ($tag)"; }
                    T[$v]=$LAST_SEC; L[$v]=$LAST_LABEL ;;
                pgbr)
                    log "[$tag] pgbackrest incr"
                    time_pgbr_backup "$conf" "$tag-incr" incr
                    T[$v]=$LAST_SEC; L[$v]=$LAST_LABEL ;;
            esac
            log "[$tag] $v incr: ${T[$v]}s, ${L[$v]}"
            BEST[$s,$v]=$(min2 "${BEST[$s,$v]:-}" "${T[$v]}")
        done

        # ---- what each incremental did
        for v in wal hash; do
            pj=$(pgs_info_json "$d/repo-$v" "$tag-$v")
            li="${L[$v]}"
            [[ $(pgs_backup_field "$pj" "$li" type) == incr ]] || die "pgstrata backup $li is not an incr"
            TRK[$tag,$v]=$(pgs_backup_field "$pj" "$li" track)
            TREASON[$tag,$v]=$(pgs_backup_field "$pj" "$li" track_reason)
            [[ "${TREASON[$tag,$v]}" == null ]] && TREASON[$tag,$v]=""
            TRACKED[$tag,$v]=$(pgs_backup_field "$pj" "$li" files_tracked)
            UNCH[$tag,$v]="$(pgs_backup_field "$pj" "$li" files_unchanged)/$(pgs_backup_field "$pj" "$li" files)"
            READ[$tag,$v]=$(pgs_backup_field "$pj" "$li" bytes_read)
            STORED[$tag,$v]=$(pgs_backup_field "$pj" "$li" stored_size)
            PGS_DBSIZE[$s]=$(pgs_backup_field "$pj" "$li" database_size)
            if (( run == 1 )); then
                lf=$("$JQ" -r '(.backups // .[0].backups)[] | select(.type == "full") | .label' <<< "$pj" | head -n 1)
                FULL_S[$s,$v]=$(pgs_backup_field "$pj" "$lf" stored_size)
            fi
            log "[$tag] pgstrata $v: track=${TRK[$tag,$v]} reason='${TREASON[$tag,$v]}' files_tracked=${TRACKED[$tag,$v]} unchanged/files=${UNCH[$tag,$v]} bytes_read=${READ[$tag,$v]} stored=${STORED[$tag,$v]}"
        done
        if [[ "${TRK[$tag,wal]}" != wal ]]; then
            log "[$tag] MISBEHAVIOUR: the --track=wal repository's incremental used track '${TRK[$tag,wal]}': ${TREASON[$tag,wal]}"
        fi
        bj=$(pgbr_info_json "$conf" "$tag")
        [[ $(pgbr_backup_field "$bj" "${L[pgbr]}" .type) == incr ]] || die "pgBackRest backup ${L[pgbr]} is not an incr"
        STORED[$tag,pgbr]=$(pgbr_backup_field "$bj" "${L[pgbr]}" .info.repository.delta)
        READ[$tag,pgbr]=$(pgbr_backup_field "$bj" "${L[pgbr]}" .info.delta)
        (( run == 1 )) && FULL_S[$s,pgbr]=$(pgbr_backup_field "$bj" "$PGBR_FULL_LABEL" .info.repository.delta)
        log "[$tag] pgbackrest: copied ${READ[$tag,pgbr]} bytes, stored ${STORED[$tag,pgbr]}"
        DETAIL_ROWS+=("$tag")
        T_RUN[$tag]="${T[wal]} ${T[hash]} ${T[pgbr]}"
    done

    # ---- verify the last WAL-tracked incremental
    if (( VERIFY )); then
        rdir="$d/restore-wal"; new_restore_dir "$rdir"
        log "[$s] verify: pgstrata restore --set=${L[wal]} (repository wal)"
        time_pgstrata_restore "$d/repo-wal" "$rdir" "$s-wal-verify" --set="${L[wal]}"
        verify_restore "$rdir" "$s-wal" "after-$s"
        rm -rf "$rdir"
    fi

    LAST_WAL_REPO="$d/repo-wal"
    # keep only this scale's repositories (disk space) unless --keep
    if (( ! KEEP )); then
        for old in "$RUNDIR"/*; do [[ "$old" != "$d" ]] && rm -rf "$old"; done
    fi
    si=$((si + 1))
done

# ------------------------------------------------------------------------ archive-push cost
declare -A PUSH_BEST PUSH_CPU PUSH_ALL
if (( SEGMENTS > 0 )); then
    SEG_SIZE=$(psql_src -d postgres -At -c "SELECT setting::bigint * CASE unit WHEN 'B' THEN 1 WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576 ELSE 1 END FROM pg_settings WHERE name = 'wal_segment_size'")
    log "archive-push: generating $SEGMENTS WAL segments with pgbench (TPC-B, 2 clients, synchronous_commit=off)"
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
    psql_src -d postgres -At -c "SELECT pg_switch_wal()" >/dev/null
    LSN0=$(psql_src -d postgres -At -c "SELECT pg_current_wal_lsn()")
    # first segment written entirely by pgbench: the one holding LSN0 (a switch just happened)
    SEG0_START=$(psql_src -d postgres -At -c "SELECT (pg_wal_lsn_diff('$LSN0', '0/0')::bigint / $SEG_SIZE) * $SEG_SIZE")
    PGB_TX=0
    for ((i = 0; i < 60; i++)); do
        have=$(psql_src -d postgres -At -c "SELECT (pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint - $SEG0_START) / $SEG_SIZE")
        (( have >= SEGMENTS )) && break
        as_pg env PGOPTIONS='-c synchronous_commit=off' "$PGBENCH" -n -c 2 -j 2 -M prepared -T 5 \
            -h "$SOCK" -p "$PORT" -U postgres postgres >"$LOGDIR/pgbench-wal-$i.out" 2>&1 || die "pgbench failed ($LOGDIR/pgbench-wal-$i.out)"
        PGB_TX=$((PGB_TX + $(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$LOGDIR/pgbench-wal-$i.out")))
    done
    (( have >= SEGMENTS )) || die "pgbench did not write $SEGMENTS segments in 300 s"
    wal_switch_and_wait
    SEG_NAMES=()
    for ((i = 0; i < SEGMENTS; i++)); do
        SEG_NAMES+=("$(psql_src -d postgres -At -c "SELECT pg_walfile_name(pg_lsn '0/0' + ($SEG0_START + $i::bigint * $SEG_SIZE + 1)::numeric)")")
    done
    log "archive-push: segments ${SEG_NAMES[0]} .. ${SEG_NAMES[-1]} ($PGB_TX pgbench transactions); fetching them with archive-get"
    # What the WAL tracking makes of a window with this much ordinary traffic: an incremental
    # with pgstrata's default --track=auto into the last scale's wal repository.
    wait_idle "the incremental after pgbench traffic"
    log "incremental (--track=auto) after the pgbench traffic"
    pgs_backup_try "$LAST_WAL_REPO" "traffic-auto" --type=incr --track=auto \
        || { tail -n 20 "$LOGDIR/pgstrata-backup-traffic-auto.err" >&2; die "pgstrata incr after traffic failed"; }
    TRAFFIC_T=$LAST_SEC
    pj=$(pgs_info_json "$LAST_WAL_REPO" traffic)
    TRAFFIC_TRK=$(pgs_backup_field "$pj" "$LAST_LABEL" track)
    TRAFFIC_REASON=$(pgs_backup_field "$pj" "$LAST_LABEL" track_reason)
    TRAFFIC_READ=$(pgs_backup_field "$pj" "$LAST_LABEL" bytes_read)
    TRAFFIC_STORED=$(pgs_backup_field "$pj" "$LAST_LABEL" stored_size)
    TRAFFIC_TRACKED=$(pgs_backup_field "$pj" "$LAST_LABEL" files_tracked)
    log "incr after traffic: ${TRAFFIC_T}s, track=$TRAFFIC_TRK reason='$TRAFFIC_REASON' read=$TRAFFIC_READ stored=$TRAFFIC_STORED files_tracked=$TRAFFIC_TRACKED"
    APDIR="$WORKDIR/ap"
    mkdir -p "$APDIR/seg" "$APDIR/partial"; chown -R postgres:postgres "$APDIR"
    for n in "${SEG_NAMES[@]}"; do
        run_logged "archive-get-$n" "$PGS" --stanza=$STANZA --repo-path="$LAST_WAL_REPO" --log-path="$LOGDIR" \
            archive-get "$n" "$APDIR/seg/$n" || die "archive-get $n failed"
        as_pg cp "$APDIR/seg/$n" "$APDIR/partial/$n.partial"
        [[ $(stat -c %s "$APDIR/seg/$n") == "$SEG_SIZE" ]] || die "$n is not $SEG_SIZE bytes"
    done
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
    clear_archive_targets

    push_all() {   # variant round -> PUSH_WALL PUSH_CPUS
        local v="$1" r="$2" repo="$RUNDIR/ap-$1-$2" tf="$LOGDIR/push-$1-$2.time" TIMEFORMAT='%R %U %S' u sy
        pgs_stanza_create "$repo" "ap-$v-$r"
        settle
        { time as_pg bash -c 'set -e; pgs=$1; repo=$2; stanza=$3; logd=$4; shift 4
                for f in "$@"; do
                    "$pgs" --stanza="$stanza" --repo-path="$repo" --compress-type=lz4 --compress-level=1 \
                        --log-path="$logd" archive-push "$f"
                done' _ "$PGS" "$repo" "$STANZA" "$LOGDIR" "$APDIR/$v"/* \
              >"$LOGDIR/push-$v-$r.out" 2>"$LOGDIR/push-$v-$r.err" ; } 2>"$tf" \
            || { cat "$LOGDIR/push-$v-$r.err" >&2; die "archive-push failed ($v round $r)"; }
        read -r PUSH_WALL u sy < "$tf"
        PUSH_CPUS=$(awk -v a="$u" -v b="$sy" 'BEGIN { printf "%.2f", a + b }')
        local segs maps
        segs=$(find "$repo/$STANZA/archive" -type f -name '0*' ! -name '*.map' | wc -l)
        maps=$(find "$repo/$STANZA/archive" -type f -name '*.map' | wc -l)
        (( segs == SEGMENTS )) || die "archive-push $v round $r: $segs objects archived, expected $SEGMENTS"
        if [[ $v == seg ]]; then
            (( maps == SEGMENTS )) || log "MISBEHAVIOUR: archive-push round $r wrote $maps block-change maps for $SEGMENTS segments"
        else
            (( maps == 0 )) || log "note: archive-push of .partial files wrote $maps maps"
        fi
        PUSH_MAPS[$v]=$maps
        PUSH_STORED[$v]=$(du -sb --exclude='*.map' "$repo/$STANZA/archive" | cut -f1)
        PUSH_MAPBYTES[$v]=$(find "$repo/$STANZA/archive" -type f -name '*.map' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
        PUSH_WARN[$v]=$(grep -ci 'cannot be relied on' "$LOGDIR/push-$v-$r.err" || true)
        if grep -qi "warn" "$LOGDIR/push-$v-$r.err"; then
            log "archive-push $v round $r warned: $(grep -i 'warn' "$LOGDIR/push-$v-$r.err" | head -n 5 | tr '\n' ' ')"
        fi
        (( KEEP )) || rm -rf "$repo"
    }
    declare -A PUSH_MAPS PUSH_STORED PUSH_MAPBYTES PUSH_WARN
    wait_idle "the archive-push measurement"
    for ((r = 1; r <= PUSH_ROUNDS; r++)); do
        order=(seg partial)
        (( r % 2 == 0 )) && order=(partial seg)
        for v in "${order[@]}"; do
            push_all "$v" "$r"
            log "archive-push round $r, $v: ${PUSH_WALL}s wall, ${PUSH_CPUS}s CPU for $SEGMENTS files"
            PUSH_ALL[$v]+="${PUSH_WALL} "
            PUSH_BEST[$v]=$(min2 "${PUSH_BEST[$v]:-}" "$PUSH_WALL")
            PUSH_CPU[$v]=$(min2 "${PUSH_CPU[$v]:-}" "$PUSH_CPUS")
        done
    done
fi
stop_source
T_END=$(now)

# ---------------------------------------------------------------------------------- results
mbs() { awk -v b="$1" -v t="$2" 'BEGIN { if (t + 0 == 0) print "n/a"; else printf "%.0f", b / 1048576 / t }'; }
{
    echo "## WAL-tracked incremental vs hashing vs pgBackRest 2.45 incremental, by database size"
    echo
    echo "- scenario (seed 000, backup part, scaled): pgbench -i -s SCALE + $COPIES copies test1..test$COPIES of pgbench_accounts; VACUUM ANALYZE + CHECKPOINT;"
    echo "  a full backup into each of three repositories (pgstrata \"wal\", pgstrata \"hash\", pgBackRest); then per run: UPDATE of $ROWS_CHANGED rows"
    echo "  spread evenly over pgbench_accounts and over every copy (every relation segment file's mtime moves), VACUUM ANALYZE, CHECKPOINT;"
    echo "  one incremental into each repository on that same state (order alternates): pgstrata --track=wal, pgstrata --track=hash, pgBackRest --type=incr"
    echo "- $CODEC level $LEVEL for both tools; process-max $PROCESS_MAX; start-fast; pgBackRest repo1-bundle=$PGBR_BUNDLE (2.45: file-level incremental)"
    echo "- times: wall clock of the backup command, best of $RUNS run(s); warm page cache; sync before each timed command"
    echo "- read: pgstrata info bytes_read; pgBackRest info delta (\"database backup size\": bytes of the files it copied). stored: pgstrata info stored_size;"
    echo "  pgBackRest info repository.delta (\"backup size\"). read/stored are from run 1 (every run makes the same kind of change)"
    echo "- $(tool_versions)"
    echo "- machine: $(machine_line); run took $(awk -v a="$T_START" -v b="$T_END" 'BEGIN { printf "%.0f", b - a }') s (plus ${WAITED} s waiting for other benchmarks)"
    for nn in "${NOISE_NOTES[@]}"; do echo "- noise: $nn"; done
    echo
    echo "| DB MB | large tables | pgstrata wal s | wal read MB | wal stored MB | pgstrata hash s | hash read MB | hash stored MB | pgBackRest incr s | pgBackRest read MB | pgBackRest stored MB | pgBackRest s / wal s |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for scale in "${SCALE_LIST[@]}"; do
        s="s$scale"; t1="$s-r1"
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' \
            "$(mb "${DBSIZE[$s]}")" "$((COPIES + 1)) x ${TABLE_MB[$s]} MB (scale $scale)" \
            "${BEST[$s,wal]}" "$(mb2 "${READ[$t1,wal]}")" "$(mb2 "${STORED[$t1,wal]}")" \
            "${BEST[$s,hash]}" "$(mb "${READ[$t1,hash]}")" "$(mb2 "${STORED[$t1,hash]}")" \
            "${BEST[$s,pgbr]}" "$(mb "${READ[$t1,pgbr]}")" "$(mb2 "${STORED[$t1,pgbr]}")" \
            "$(ratio "${BEST[$s,wal]}" "${BEST[$s,pgbr]}")"
    done
    echo
    echo "Every run (times in s; track as pgstrata's info reports it):"
    echo
    echo "| run | files of large tables modified | wal s | wal track (reason) | wal files_tracked | wal unchanged/files | wal read MB | wal stored MB | hash s | hash track | hash read MB | hash stored MB | pgBackRest s | pgBackRest read MB | pgBackRest stored MB |"
    echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
    for tag in "${DETAIL_ROWS[@]}"; do
        read -r tw th tp <<< "${T_RUN[$tag]}"
        wt="${TRK[$tag,wal]}"; [[ -n "${TREASON[$tag,wal]}" ]] && wt+=" (${TREASON[$tag,wal]})"
        [[ -n "${WAL_ERR[$tag]}" ]] && wt+="; --track=wal refused: ${WAL_ERR[$tag]}"
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$tag" "${TOUCHED[$tag]}" \
            "$tw" "$wt" "${TRACKED[$tag,wal]}" "${UNCH[$tag,wal]}" "$(mb2 "${READ[$tag,wal]}")" "$(mb2 "${STORED[$tag,wal]}")" \
            "$th" "${TRK[$tag,hash]}" "$(mb "${READ[$tag,hash]}")" "$(mb2 "${STORED[$tag,hash]}")" \
            "$tp" "$(mb "${READ[$tag,pgbr]}")" "$(mb2 "${STORED[$tag,pgbr]}")"
    done
    echo
    echo "Full backups (context; pgstrata: wal repository / hash repository):"
    echo
    echo "| DB MB | pgstrata full s | pgstrata full MB | pgBackRest full s | pgBackRest full MB |"
    echo "|---:|---:|---:|---:|---:|"
    for scale in "${SCALE_LIST[@]}"; do
        s="s$scale"
        printf '| %s | %s / %s | %s | %s | %s |\n' "$(mb "${DBSIZE[$s]}")" "${FULL_T[$s,wal]}" "${FULL_T[$s,hash]}" \
            "$(mb "${FULL_S[$s,wal]}")" "${FULL_T[$s,pgbr]}" "$(mb "${FULL_S[$s,pgbr]}")"
    done
    if (( VERIFY )); then
        echo
        echo "Verified (the last --track=wal incremental restored, started, WAL replayed, table contents equal to the source): ${VERIFIED[*]}"
    fi

    if (( SEGMENTS > 0 )); then
        echo
        echo "## archive-push: with WAL decoding (segments) vs without (the same bytes as .partial files)"
        echo
        echo "- $SEGMENTS real segments (${SEG_NAMES[0]} .. ${SEG_NAMES[-1]}) written by $PGB_TX pgbench TPC-B transactions (scale ${SCALE_LIST[-1]}, after a CHECKPOINT;"
        echo "  $(awk -v b=$((SEGMENTS * SEG_SIZE)) -v n="$PGB_TX" 'BEGIN { printf "%.0f", b / n }') bytes of WAL per transaction: the more full-page images, the fewer records per segment),"
        echo "  fetched with archive-get; pushed one pgstrata process per file (as archive_command does) into a fresh repository per round,"
        echo "  --compress-type=lz4 --compress-level=1; best of $PUSH_ROUNDS round(s) (order alternates); CPU = user + sys of all processes"
        echo
        echo "| files | pushed as | best wall s | segments/s | MB/s | CPU s | all rounds wall s | archived MB | maps | map MB | maps flagged unusable |"
        echo "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"
        for v in seg partial; do
            name="NAME (decoded, map written)"; [[ $v == partial ]] && name="NAME.partial (not decoded)"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$SEGMENTS" "$name" "${PUSH_BEST[$v]}" \
                "$(awk -v n="$SEGMENTS" -v t="${PUSH_BEST[$v]}" 'BEGIN { printf "%.1f", n / t }')" \
                "$(mbs $((SEGMENTS * SEG_SIZE)) "${PUSH_BEST[$v]}")" "${PUSH_CPU[$v]}" "${PUSH_ALL[$v]% }" \
                "$(mb "${PUSH_STORED[$v]}")" "${PUSH_MAPS[$v]}" "$(mb2 "${PUSH_MAPBYTES[$v]}")" "${PUSH_WARN[$v]}"
        done
        echo
        echo "Decoding overhead: wall $(awk -v a="${PUSH_BEST[seg]}" -v b="${PUSH_BEST[partial]}" 'BEGIN { printf "%+.1f %%", 100 * (a - b) / b }')," \
             "CPU $(awk -v a="${PUSH_CPU[seg]}" -v b="${PUSH_CPU[partial]}" 'BEGIN { printf "%+.1f %%", 100 * (a - b) / b }')" \
             "(segments vs .partial; target: throughput within 20 %)."
        echo
        echo "maps flagged unusable: archive-push warned \"its block-change map cannot be relied on\" for that many of the $SEGMENTS segments (each round the same)."
        echo
        echo "Incremental (pgstrata default --track=auto) into the last scale's wal repository right after this traffic:" \
             "${TRAFFIC_T} s, track ${TRAFFIC_TRK}${TRAFFIC_REASON:+ (${TRAFFIC_REASON})}, files_tracked ${TRAFFIC_TRACKED}," \
             "read $(mb "$TRAFFIC_READ") MB, stored $(mb2 "$TRAFFIC_STORED") MB."
    fi

    echo
    echo "## Targets"
    echo
    for scale in "${SCALE_LIST[@]}"; do
        s="s$scale"; t1="$s-r1"
        r=$(ratio "${BEST[$s,wal]}" "${BEST[$s,pgbr]}")
        ok=$(awk -v r="$r" 'BEGIN { print (r + 0 >= 5) ? "met" : "NOT met" }')
        st=$(awk -v a="${STORED[$t1,wal]}" -v b="${STORED[$t1,pgbr]}" 'BEGIN { print (a + 0 <= b + 0) ? "met" : "NOT met" }')
        echo "- $(mb "${DBSIZE[$s]}") MB: WAL-tracked incr ${r}x faster than pgBackRest's incr (target >= 5x): $ok;" \
             "stores $(mb2 "${STORED[$t1,wal]}") MB vs $(mb2 "${STORED[$t1,pgbr]}") MB (target: no more): $st"
    done
    first="s${SCALE_LIST[0]}"; last="s${SCALE_LIST[-1]}"
    if [[ "$first" != "$last" ]]; then
        echo "- flat vs growing, smallest to largest database ($(mb "${DBSIZE[$first]}") -> $(mb "${DBSIZE[$last]}") MB, x$(ratio "${DBSIZE[$first]}" "${DBSIZE[$last]}")):" \
             "wal read x$(ratio "${READ[$first-r1,wal]}" "${READ[$last-r1,wal]}"), wal time x$(ratio "${BEST[$first,wal]}" "${BEST[$last,wal]}");" \
             "hash read x$(ratio "${READ[$first-r1,hash]}" "${READ[$last-r1,hash]}"), hash time x$(ratio "${BEST[$first,hash]}" "${BEST[$last,hash]}")"
    fi
    if (( SEGMENTS > 0 )); then
        ov=$(awk -v a="${PUSH_BEST[seg]}" -v b="${PUSH_BEST[partial]}" 'BEGIN { printf "%.1f", 100 * (a - b) / b }')
        echo "- archive-push with decoding: ${ov} % slower than without (target: within 20 %): $(awk -v o="$ov" 'BEGIN { print (o + 0 <= 20) ? "met" : "NOT met" }')"
        [[ "$TRAFFIC_TRK" == wal ]] || echo "- after $SEGMENTS segments of pgbench traffic, the default (--track=auto) incremental hashed instead of using the WAL: $TRAFFIC_REASON"
        (( ${PUSH_WARN[seg]:-0} == 0 )) || echo "- archive-push flagged ${PUSH_WARN[seg]} of $SEGMENTS block-change maps as unusable (a record's block headers cut by the segment end)"
    fi
    for tag in "${DETAIL_ROWS[@]}"; do
        [[ "${TRK[$tag,wal]}" == wal && -z "${WAL_ERR[$tag]}" ]] \
            || echo "- $tag: the --track=wal incremental did not use the WAL: track '${TRK[$tag,wal]}' (${TREASON[$tag,wal]}) ${WAL_ERR[$tag]}"
    done
    echo
    echo "Command: \`${ARGS_LINE% }\`"
} > "$WORKDIR/results.md"

emit_results "$WORKDIR/results.md"
