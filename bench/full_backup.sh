#!/usr/bin/env bash
# bench/full_backup.sh — full backup / full restore: pgstrata vs pgBackRest, side by side.
#
# Usage:
#   bench/full_backup.sh [--scale N] [--copies N] [--process-max N] [--codecs zst,lz4,gz]
#                        [--runs N] [--pgbr-bundle n|y|both] [--verify] [--port N]
#                        [--workdir DIR] [--keep] [--no-build] [--pgstrata BIN] [--out FILE]
#
#   --scale N          pgbench scale factor (default 20; 1 scale = 100,000 rows, ~13 MB heap)
#   --copies N         extra copies of pgbench_accounts (acc_1..acc_N; default 2)
#   --process-max N    worker count given to both tools, for backup and restore (default 2)
#   --codecs LIST      comma-separated compression types, each at its default level
#                      (zst 3, lz4 1, gz 6; also none, bz2) (default zst,lz4,gz)
#   --runs N           repeat each measurement N times, each in fresh repositories, and keep
#                      the best (minimum) time (default 1)
#   --pgbr-bundle V    pgBackRest repo1-bundle: n (pgBackRest default), y, or both (two
#                      pgBackRest rows per codec; pgstrata's numbers are shared) (default n)
#   --verify           start the cluster restored by pgstrata (WAL replay through
#                      pgstrata archive-get) and compare row counts/sums with the source
#   --port N           port of the throwaway source cluster (default 55432; N+1 for --verify)
#   --workdir DIR      scratch directory (default: mktemp -d under /var/tmp); must not exist
#   --keep             keep the scratch directory (repositories, logs) at the end
#   --no-build         do not run cargo build; use the existing release binary
#   --pgstrata BIN     pgstrata binary to use (implies --no-build)
#   --out FILE         also write the results (markdown) to FILE
#
# What it does (scenario "seed 000", see bench/README.md):
#   1. builds pgstrata in release mode (CARGO_TARGET_DIR=target/bench, not the shared target/);
#   2. initdb (data checksums on) and starts a PostgreSQL 15 cluster as the `postgres` OS user,
#      archive_mode=on with an archive_command that pushes every segment to BOTH tools;
#   3. pgbench -i -s SCALE, then COPIES x CREATE TABLE acc_i AS SELECT * FROM pgbench_accounts,
#      reads every table once (settles hint bits, records row counts/sums), CHECKPOINT;
#   4. for each codec (and run): fresh repositories, stanza-create for both tools, then
#      a timed full backup with each tool (order alternates), the backup-area size of each
#      repository (du -sb), and a timed full restore of each backup into an empty directory;
#   5. prints a markdown table with pgBackRest/pgstrata ratios (> 1 means pgstrata is
#      faster / smaller).
#
# Requirements: run as root; PostgreSQL 15 server binaries in /usr/lib/postgresql/15/bin (or
# PG_BIN=...); pgbench; pgbackrest (apt-get install -y pgbackrest); jq; cargo (unless --no-build).
# Shared helpers (cluster setup, archive command, timing, tool wrappers) are in bench/lib.sh.
# Both tools run as the `postgres` OS user. Timings are wall-clock (bash EPOCHREALTIME) of the
# command alone; both tools fsync what they write. The page cache is NOT dropped: the database
# is read from memory by both tools.

set -Eeuo pipefail

BENCH_NAME=full_backup.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------- options
bench_defaults
SCALE=20
COPIES=2
CODECS="zst,lz4,gz"
RUNS=1
PGBR_BUNDLE=n
VERIFY=0

while [[ $# -gt 0 ]]; do
    bench_common_option "$@"
    if (( SHIFT_N )); then shift "$SHIFT_N"; continue; fi
    case "$1" in
        --scale) need_arg "$@"; SCALE="$2"; shift 2 ;;
        --scale=*) SCALE="${1#*=}"; shift ;;
        --copies) need_arg "$@"; COPIES="$2"; shift 2 ;;
        --copies=*) COPIES="${1#*=}"; shift ;;
        --codecs) need_arg "$@"; CODECS="$2"; shift 2 ;;
        --codecs=*) CODECS="${1#*=}"; shift ;;
        --runs) need_arg "$@"; RUNS="$2"; shift 2 ;;
        --runs=*) RUNS="${1#*=}"; shift ;;
        --pgbr-bundle) need_arg "$@"; PGBR_BUNDLE="$2"; shift 2 ;;
        --pgbr-bundle=*) PGBR_BUNDLE="${1#*=}"; shift ;;
        --verify) VERIFY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

is_uint "$SCALE" && (( SCALE >= 1 )) || die "--scale must be a positive integer, got '$SCALE'"
is_uint "$COPIES" || die "--copies must be a non-negative integer, got '$COPIES'"
is_uint "$RUNS" && (( RUNS >= 1 )) || die "--runs must be >= 1, got '$RUNS'"
check_common_options
case "$PGBR_BUNDLE" in n) PGBR_VARIANTS=(n) ;; y) PGBR_VARIANTS=(y) ;; both) PGBR_VARIANTS=(n y) ;;
    *) die "--pgbr-bundle must be n, y or both, got '$PGBR_BUNDLE'" ;; esac
parse_codecs "$CODECS"

bench_prereqs
bench_binary
bench_workdir

# --------------------------------------------------------------------------- source cluster
init_source_cluster
load_pgbench_and_copies "$SCALE" "$COPIES" acc_
# Read every table once: sets hint bits now (so later reads do not change pages between
# measurements) and records what a correct restore must contain.
log "reading all tables once, CHECKPOINT"
record_source_check source
psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"

database_sizes
log "database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"

# ------------------------------------------------------------------------------ measurement
declare -A T R S   # T[tool,codec]=best backup s, R[..]=best restore s, S[..]=repo bytes

ci=0
for codec in "${CODEC_LIST[@]}"; do
    level=$(default_level "$codec")
    for ((run = 1; run <= RUNS; run++)); do
        tag="$codec-r$run"
        d="$RUNDIR/$tag"
        mkdir -p "$d"; chown postgres:postgres "$d"
        pgs_repo="$d/repo-pgstrata"
        as_pg mkdir -p "$pgs_repo"
        confs=""
        for v in "${PGBR_VARIANTS[@]}"; do
            as_pg mkdir -p "$d/repo-pgbackrest-b$v"
            write_pgbr_conf "$d/pgbackrest-b$v.conf" "$d/repo-pgbackrest-b$v" "$codec" "$level" "$v"
            chown postgres:postgres "$d/pgbackrest-b$v.conf"
            confs+="$d/pgbackrest-b$v.conf "
        done

        log "[$tag] stanza-create (pgstrata, pgBackRest)"
        run_logged "pgstrata-stanza-create-$tag" "$PGS" --stanza=$STANZA --repo-path="$pgs_repo" --pg-path="$SRC" \
            --pg-host="$SOCK" --pg-port="$PORT" --pg-user=postgres --log-path="$LOGDIR" stanza-create \
            || die "pgstrata stanza-create failed ($tag)"
        for v in "${PGBR_VARIANTS[@]}"; do
            run_logged "pgbackrest-stanza-create-$tag-b$v" "$PGBACKREST" --config="$d/pgbackrest-b$v.conf" \
                --stanza=$STANZA stanza-create || die "pgbackrest stanza-create failed ($tag, bundle=$v)"
        done
        # Point the archive command at the new repositories (atomically).
        set_archive_targets "$codec" "$level" "$pgs_repo" "$confs"
        # The previous run's repositories are no longer needed.
        if (( ! KEEP )); then
            for old in "$RUNDIR"/*; do
                if [[ "$old" != "$d" ]]; then rm -rf "$old"; fi
            done
        fi

        # Backups: alternate which tool goes first to spread any ordering effect.
        order=(pgstrata pgbackrest)
        if (( (ci + run) % 2 == 0 )); then order=(pgbackrest pgstrata); fi
        for tool in "${order[@]}"; do
            if [[ $tool == pgstrata ]]; then
                log "[$tag] pgstrata backup --compress-type=$codec --compress-level=$level --process-max=$PROCESS_MAX"
                time_pgstrata_backup "$pgs_repo" "$codec" "$level" "$tag"
                PGS_LABEL="$LAST_LABEL"
                T[pgstrata,$codec]=$(min2 "${T[pgstrata,$codec]:-}" "$LAST_SEC")
                log "[$tag] pgstrata backup: ${LAST_SEC}s, label $PGS_LABEL"
            else
                for v in "${PGBR_VARIANTS[@]}"; do
                    log "[$tag] pgbackrest backup (repo1-bundle=$v)"
                    time_pgbr_backup "$d/pgbackrest-b$v.conf" "$tag-b$v"
                    T[pgbackrest-b$v,$codec]=$(min2 "${T[pgbackrest-b$v,$codec]:-}" "$LAST_SEC")
                    log "[$tag] pgbackrest backup (bundle=$v): ${LAST_SEC}s"
                done
            fi
        done

        # Repository sizes: the backup area only (archived WAL excluded).
        [[ -d "$pgs_repo/$STANZA/backup" ]] || die "pgstrata repository has no $STANZA/backup directory (layout changed?): $(ls "$pgs_repo/$STANZA" 2>&1)"
        S[pgstrata,$codec]=$(du -sb "$pgs_repo/$STANZA/backup" | cut -f1)
        for v in "${PGBR_VARIANTS[@]}"; do
            S[pgbackrest-b$v,$codec]=$(du -sb "$d/repo-pgbackrest-b$v/backup/$STANZA" | cut -f1)
        done
        run_logged "pgstrata-info-$tag" "$PGS" --stanza=$STANZA --repo-path="$pgs_repo" --output=json info || true

        # Restores into empty directories.
        for tool in "${order[@]}"; do
            if [[ $tool == pgstrata ]]; then
                rdir="$d/restore-pgstrata"; new_restore_dir "$rdir"
                log "[$tag] pgstrata restore --set=$PGS_LABEL --process-max=$PROCESS_MAX"
                settle
                t0=$(now)
                run_logged "pgstrata-restore-$tag" "$PGS" --stanza=$STANZA --repo-path="$pgs_repo" --pg-path="$rdir" \
                    --log-path="$LOGDIR" --process-max="$PROCESS_MAX" --set="$PGS_LABEL" restore \
                    || die "pgstrata restore failed ($tag)"
                t1=$(now); sec=$(elapsed "$t0" "$t1")
                R[pgstrata,$codec]=$(min2 "${R[pgstrata,$codec]:-}" "$sec")
                log "[$tag] pgstrata restore: ${sec}s ($(mb "$(du -sb "$rdir" | cut -f1)") MB restored)"
            else
                for v in "${PGBR_VARIANTS[@]}"; do
                    rdir="$d/restore-pgbackrest-b$v"; new_restore_dir "$rdir"
                    log "[$tag] pgbackrest restore (repo1-bundle=$v)"
                    settle
                    t0=$(now)
                    run_logged "pgbackrest-restore-$tag-b$v" "$PGBACKREST" --config="$d/pgbackrest-b$v.conf" \
                        --stanza=$STANZA --pg1-path="$rdir" restore \
                        || die "pgbackrest restore failed ($tag, bundle=$v)"
                    t1=$(now); sec=$(elapsed "$t0" "$t1")
                    R[pgbackrest-b$v,$codec]=$(min2 "${R[pgbackrest-b$v,$codec]:-}" "$sec")
                    log "[$tag] pgbackrest restore (bundle=$v): ${sec}s ($(mb "$(du -sb "$rdir" | cut -f1)") MB restored)"
                done
            fi
        done

        # Sanity: both restores should hold about the same bytes outside pg_wal.
        for v in "${PGBR_VARIANTS[@]}"; do
            a=$(du -sb --exclude=pg_wal "$d/restore-pgstrata" | cut -f1)
            b=$(du -sb --exclude=pg_wal "$d/restore-pgbackrest-b$v" | cut -f1)
            log "[$tag] restored bytes without pg_wal: pgstrata $a, pgbackrest(bundle=$v) $b, source $DATADIR_BYTES"
        done

        if (( VERIFY )) && (( run == 1 )); then
            verify_restore "$d/restore-pgstrata" "$tag" source
        fi
        rm -rf "$d"/restore-*
    done
    ci=$((ci + 1))
done
clear_archive_targets

# ---------------------------------------------------------------------------------- results
{
    echo "## Full backup and restore: pgstrata vs pgBackRest"
    echo
    echo "- scenario: pgbench -i -s $SCALE + $COPIES copies of pgbench_accounts (CREATE TABLE AS), data checksums on, autovacuum off"
    echo "- database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- process-max $PROCESS_MAX for both tools; each codec at its default level (zst 3, lz4 1, gz 6); start-fast"
    echo "- $(tool_versions)"
    echo "- times: wall clock of the command, best of $RUNS run(s), fresh repositories per run; warm page cache; sync before each timed command"
    echo "- repo size: du -sb of the backup area (pgstrata: REPO/$STANZA/backup, pgBackRest: REPO/backup/$STANZA), archived WAL excluded"
    echo "- ratio = pgBackRest / pgstrata (> 1: pgstrata faster or smaller)"
    echo "- machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo) RAM, shared with other work: expect noise"
    echo
    echo "| codec | pgstrata backup s | pgbackrest backup s | ratio | pgstrata restore s | pgbackrest restore s | ratio | pgstrata repo MB | pgbackrest repo MB | ratio |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for codec in "${CODEC_LIST[@]}"; do
        for v in "${PGBR_VARIANTS[@]}"; do
            name="$codec"
            [[ "$v" == y ]] && name="$codec (pgBackRest repo1-bundle=y)"
            k="pgbackrest-b$v,$codec"; p="pgstrata,$codec"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" \
                "${T[$p]}" "${T[$k]}" "$(ratio "${T[$p]}" "${T[$k]}")" \
                "${R[$p]}" "${R[$k]}" "$(ratio "${R[$p]}" "${R[$k]}")" \
                "$(mb "${S[$p]}")" "$(mb "${S[$k]}")" "$(ratio "${S[$p]}" "${S[$k]}")"
        done
    done
    if (( VERIFY )); then
        echo
        echo "Verified (restored by pgstrata, started, WAL replayed, table contents equal to the source): ${VERIFIED[*]}"
    fi
} > "$WORKDIR/results.md"

echo
cat "$WORKDIR/results.md"
if [[ -n "$OUT" ]]; then
    cp "$WORKDIR/results.md" "$OUT"
    log "results written to $OUT"
fi
