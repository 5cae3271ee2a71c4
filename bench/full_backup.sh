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
# PG_BIN=...); pgbench; pgbackrest (apt-get install -y pgbackrest); cargo (unless --no-build).
# Both tools run as the `postgres` OS user. Timings are wall-clock (bash EPOCHREALTIME) of the
# command alone; both tools fsync what they write. The page cache is NOT dropped: the database
# is read from memory by both tools.

set -Eeuo pipefail

# ---------------------------------------------------------------------------------- options
SCALE=20
COPIES=2
PROCESS_MAX=2
CODECS="zst,lz4,gz"
RUNS=1
PGBR_BUNDLE=n
VERIFY=0
PORT=55432
WORKDIR=""
KEEP=0
BUILD=1
PGSTRATA_BIN=""
OUT=""
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
STANZA=bench

die() { echo "full_backup.sh: ERROR: $*" >&2; exit 1; }
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; }

need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "option $1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --scale) need_arg "$@"; SCALE="$2"; shift 2 ;;
        --scale=*) SCALE="${1#*=}"; shift ;;
        --copies) need_arg "$@"; COPIES="$2"; shift 2 ;;
        --copies=*) COPIES="${1#*=}"; shift ;;
        --process-max) need_arg "$@"; PROCESS_MAX="$2"; shift 2 ;;
        --process-max=*) PROCESS_MAX="${1#*=}"; shift ;;
        --codecs) need_arg "$@"; CODECS="$2"; shift 2 ;;
        --codecs=*) CODECS="${1#*=}"; shift ;;
        --runs) need_arg "$@"; RUNS="$2"; shift 2 ;;
        --runs=*) RUNS="${1#*=}"; shift ;;
        --pgbr-bundle) need_arg "$@"; PGBR_BUNDLE="$2"; shift 2 ;;
        --pgbr-bundle=*) PGBR_BUNDLE="${1#*=}"; shift ;;
        --verify) VERIFY=1; shift ;;
        --port) need_arg "$@"; PORT="$2"; shift 2 ;;
        --port=*) PORT="${1#*=}"; shift ;;
        --workdir) need_arg "$@"; WORKDIR="$2"; shift 2 ;;
        --workdir=*) WORKDIR="${1#*=}"; shift ;;
        --keep) KEEP=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --pgstrata) need_arg "$@"; PGSTRATA_BIN="$2"; BUILD=0; shift 2 ;;
        --pgstrata=*) PGSTRATA_BIN="${1#*=}"; BUILD=0; shift ;;
        --out) need_arg "$@"; OUT="$2"; shift 2 ;;
        --out=*) OUT="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint "$SCALE" && (( SCALE >= 1 )) || die "--scale must be a positive integer, got '$SCALE'"
is_uint "$COPIES" || die "--copies must be a non-negative integer, got '$COPIES'"
is_uint "$PROCESS_MAX" && (( PROCESS_MAX >= 1 )) || die "--process-max must be >= 1, got '$PROCESS_MAX'"
is_uint "$RUNS" && (( RUNS >= 1 )) || die "--runs must be >= 1, got '$RUNS'"
is_uint "$PORT" && (( PORT > 1024 && PORT < 65535 )) || die "--port must be in 1025..65534, got '$PORT'"
case "$PGBR_BUNDLE" in n) PGBR_VARIANTS=(n) ;; y) PGBR_VARIANTS=(y) ;; both) PGBR_VARIANTS=(n y) ;;
    *) die "--pgbr-bundle must be n, y or both, got '$PGBR_BUNDLE'" ;; esac
IFS=',' read -r -a CODEC_LIST <<< "$CODECS"
(( ${#CODEC_LIST[@]} > 0 )) || die "--codecs is empty"
default_level() {
    case "$1" in zst) echo 3 ;; lz4) echo 1 ;; gz) echo 6 ;; bz2) echo 9 ;; none) echo 0 ;;
        *) return 1 ;; esac
}
for c in "${CODEC_LIST[@]}"; do default_level "$c" >/dev/null || die "unknown codec '$c' (zst, lz4, gz, bz2, none)"; done

# ---------------------------------------------------------------------------- prerequisites
[[ $(id -u) -eq 0 ]] || die "run as root (the clusters and both tools run as the postgres OS user via runuser)"
id postgres >/dev/null 2>&1 || die "no 'postgres' OS user"
for b in initdb pg_ctl postgres psql; do
    [[ -x "$PG_BIN/$b" ]] || die "$PG_BIN/$b not found (set PG_BIN=...)"
done
PGBENCH="$PG_BIN/pgbench"; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
PGBACKREST=$(command -v pgbackrest) || die "pgbackrest not found: apt-get update && apt-get install -y pgbackrest"
[[ -n "${EPOCHREALTIME:-}" ]] || die "bash >= 5 needed (EPOCHREALTIME)"

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

if [[ -z "$PGSTRATA_BIN" ]]; then
    PGSTRATA_BIN="$ROOT/target/bench/release/pgstrata"
    if (( BUILD )); then
        log "building pgstrata (release, CARGO_TARGET_DIR=$ROOT/target/bench)"
        (cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target/bench" cargo build --release -p pgstrata) \
            || die "cargo build --release -p pgstrata failed"
    fi
fi
[[ -x "$PGSTRATA_BIN" ]] || die "pgstrata binary $PGSTRATA_BIN not found or not executable (build it or pass --pgstrata)"

# ------------------------------------------------------------------------------ scratch dir
if [[ -z "$WORKDIR" ]]; then
    WORKDIR=$(mktemp -d /var/tmp/pgstrata-bench.XXXXXX)
else
    [[ -e "$WORKDIR" ]] && die "--workdir $WORKDIR already exists; give a new path"
    mkdir -p "$WORKDIR"
fi
WORKDIR=$(cd "$WORKDIR" && pwd)
chmod 755 "$WORKDIR"
SRC="$WORKDIR/src"            # source cluster data directory
SOCK="$WORKDIR/sock"          # socket directory of the source (and verify) cluster
LOGDIR="$WORKDIR/log"         # server log, tool output, pgBackRest log-path
BIN="$WORKDIR/bin"            # pgstrata copy + archive script (readable by postgres)
RUNDIR="$WORKDIR/run"         # per codec/run repositories, configs and restores
mkdir -p "$SOCK" "$LOGDIR" "$BIN" "$RUNDIR" "$WORKDIR/lock"
cp "$PGSTRATA_BIN" "$BIN/pgstrata"
chmod 755 "$BIN/pgstrata"
PGS="$BIN/pgstrata"
chown -R postgres:postgres "$WORKDIR"
cd "$WORKDIR"   # commands run as postgres need a current directory they can access

VERIFY_DATA=""
CLEANED=0
cleanup() {
    local rc=$?
    (( CLEANED )) && return
    CLEANED=1
    set +e
    if [[ -n "$VERIFY_DATA" && -f "$VERIFY_DATA/postmaster.pid" ]]; then
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$VERIFY_DATA" -m immediate -w stop >/dev/null 2>&1
    fi
    if [[ -f "$SRC/postmaster.pid" ]]; then
        log "stopping source cluster"
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$SRC" -m fast -w stop >/dev/null 2>&1 \
            || runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$SRC" -m immediate -w stop >/dev/null 2>&1
    fi
    if (( KEEP )) || (( rc != 0 )); then
        log "scratch directory kept: $WORKDIR (logs in $LOGDIR)"
    else
        rm -rf "$WORKDIR"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'echo "full_backup.sh: ERROR: command failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR
trap 'exit 130' INT TERM

as_pg() { runuser -u postgres -- "$@"; }
psql_src() { as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$PORT" -U postgres "$@"; }
now() { echo "$EPOCHREALTIME"; }
# Flush dirty pages left by earlier steps (repositories, deleted restores) so that no timed
# command pays for another one's writeback. Not part of any timing.
settle() { sync; sleep 1; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
min2() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b + 0 < a + 0) print b; else print a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 == 0) print "n/a"; else printf "%.2f", b / a }'; }
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# Run a command as postgres with its stdout/stderr in $LOGDIR/$1.{out,err}; on failure print them.
run_logged() {
    local name="$1"; shift
    if ! as_pg "$@" >"$LOGDIR/$name.out" 2>"$LOGDIR/$name.err"; then
        echo "full_backup.sh: ERROR: '$name' failed: $*" >&2
        echo "--- stdout ($LOGDIR/$name.out):" >&2; tail -n 40 "$LOGDIR/$name.out" >&2
        echo "--- stderr ($LOGDIR/$name.err):" >&2; tail -n 40 "$LOGDIR/$name.err" >&2
        return 1
    fi
}

# --------------------------------------------------------------------------- source cluster
log "scratch directory: $WORKDIR"
log "initdb (data checksums on)"
run_logged initdb "$PG_BIN/initdb" -D "$SRC" -U postgres --data-checksums -A trust \
    || die "initdb failed"

# The archive command pushes to both tools. Which repositories it pushes to is read from
# archive.env at each call, so the benchmark switches repositories per codec without a reload.
# (pgBackRest refuses to back up unless archive_command contains "pgbackrest": hence the name.)
ARCHIVE_ENV="$BIN/archive.env"
cat > "$BIN/archive-pgstrata-and-pgbackrest.sh" <<EOF
#!/bin/bash
# archive_command of the benchmark cluster: push one WAL segment to pgstrata and to pgBackRest.
set -euo pipefail
ENV_FILE="$ARCHIVE_ENV"
[[ -f "\$ENV_FILE" ]] || exit 0     # no repository configured yet: drop the segment
. "\$ENV_FILE"
"$PGS" --stanza=$STANZA --repo-path="\$PGS_REPO" --compress-type="\$CODEC" --compress-level="\$LEVEL" \\
    --log-path="$LOGDIR" archive-push "\$1"
for conf in \$PGBR_CONFS; do
    "$PGBACKREST" --config="\$conf" --stanza=$STANZA archive-push "\$1"
done
EOF
chmod 755 "$BIN/archive-pgstrata-and-pgbackrest.sh"
chown postgres:postgres "$BIN/archive-pgstrata-and-pgbackrest.sh"

cat >> "$SRC/postgresql.conf" <<EOF

# ---- pgstrata benchmark (bench/full_backup.sh)
port = $PORT
listen_addresses = ''
unix_socket_directories = '$SOCK'
shared_buffers = 256MB
max_wal_size = 8GB
checkpoint_timeout = 30min
wal_level = replica
archive_mode = on
archive_command = '$BIN/archive-pgstrata-and-pgbackrest.sh %p'
autovacuum = off
logging_collector = off
EOF

log "starting source cluster on port $PORT"
run_logged pg_ctl_start "$PG_BIN/pg_ctl" -D "$SRC" -l "$LOGDIR/postgres-src.log" -w -t 120 start \
    || die "source cluster did not start (see $LOGDIR/postgres-src.log)"

log "pgbench -i -s $SCALE"
run_logged pgbench_init "$PGBENCH" -i -s "$SCALE" -q -h "$SOCK" -p "$PORT" -U postgres postgres \
    || die "pgbench -i failed"
TABLES=(pgbench_accounts)
for ((i = 1; i <= COPIES; i++)); do
    log "CREATE TABLE acc_$i AS SELECT * FROM pgbench_accounts"
    psql_src -d postgres -c "CREATE TABLE acc_$i AS SELECT * FROM pgbench_accounts" \
        || die "creating acc_$i failed"
    TABLES+=("acc_$i")
done
# Read every table once: sets hint bits now (so later reads do not change pages between
# measurements) and records what a correct restore must contain.
CHECK_SQL=""
for t in "${TABLES[@]}" pgbench_branches pgbench_tellers; do
    [[ -n "$CHECK_SQL" ]] && CHECK_SQL+=" UNION ALL "
    CHECK_SQL+="SELECT '$t', count(*), sum(abs(hashtext(t::text)::bigint)) FROM $t AS t"
done
CHECK_SQL="SELECT * FROM ($CHECK_SQL) s ORDER BY 1"
log "reading all tables once, CHECKPOINT"
psql_src -d postgres -At -c "$CHECK_SQL" > "$LOGDIR/check-source.txt" || die "reading the tables failed"
psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"

DB_BYTES=$(psql_src -d postgres -At -c "SELECT sum(pg_database_size(oid)) FROM pg_database")
DATADIR_BYTES=$(du -sb --exclude=pg_wal "$SRC" | cut -f1)
log "database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"

# ------------------------------------------------------------------------------ measurement
declare -A T R S   # T[tool,codec]=best backup s, R[..]=best restore s, S[..]=repo bytes

write_pgbr_conf() {   # conf repo codec level bundle
    cat > "$1" <<EOF
[global]
repo1-path=$2
repo1-retention-full=99
repo1-bundle=$5
compress-type=$3
compress-level=$4
process-max=$PROCESS_MAX
start-fast=y
log-path=$LOGDIR
lock-path=$WORKDIR/lock
log-level-console=warn
log-level-file=off

[$STANZA]
pg1-path=$SRC
pg1-socket-path=$SOCK
pg1-port=$PORT
pg1-user=postgres
EOF
}

time_pgstrata_backup() {   # repo codec level tag -> sets LAST_SEC, LAST_LABEL
    local repo="$1" codec="$2" level="$3" tag="$4" t0 t1
    settle
    t0=$(now)
    run_logged "pgstrata-backup-$tag" "$PGS" --stanza=$STANZA --repo-path="$repo" --pg-path="$SRC" \
        --pg-host="$SOCK" --pg-port="$PORT" --pg-user=postgres --log-path="$LOGDIR" \
        --compress-type="$codec" --compress-level="$level" --process-max="$PROCESS_MAX" \
        --start-fast backup || die "pgstrata backup failed ($tag)"
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
    LAST_LABEL=$(grep -v '^[[:space:]]*$' "$LOGDIR/pgstrata-backup-$tag.out" | tail -n 1 | awk '{print $NF}')
    [[ -n "$LAST_LABEL" ]] || die "pgstrata backup printed no label ($LOGDIR/pgstrata-backup-$tag.out)"
}

time_pgbr_backup() {   # conf tag -> LAST_SEC
    local conf="$1" tag="$2" t0 t1
    settle
    t0=$(now)
    run_logged "pgbackrest-backup-$tag" "$PGBACKREST" --config="$conf" --stanza=$STANZA --type=full backup \
        || die "pgbackrest backup failed ($tag)"
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
}

new_restore_dir() {   # path: empty directory owned by postgres, mode 0700
    rm -rf "$1"; mkdir -p "$1"; chown postgres:postgres "$1"; chmod 700 "$1"
}

# Start a restored cluster, let it replay WAL and promote, and compare the table contents.
verify_restore() {   # datadir tag
    local data="$1" tag="$2" vport=$((PORT + 1)) i
    VERIFY_DATA="$data"
    log "verify: starting the cluster restored by pgstrata ($tag) on port $vport"
    rm -f "$data/postmaster.pid"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$LOGDIR/postgres-verify-$tag.log" -w -t 300 \
        -o "-c port=$vport -c archive_mode=off -c unix_socket_directories=$SOCK" start \
        >"$LOGDIR/verify-start-$tag.out" 2>&1; then
        tail -n 30 "$LOGDIR/postgres-verify-$tag.log" >&2
        die "verify: the cluster restored by pgstrata did not start ($tag); log: $LOGDIR/postgres-verify-$tag.log"
    fi
    for ((i = 0; i < 300; i++)); do
        [[ $(as_pg "$PG_BIN/psql" -X -At -h "$SOCK" -p "$vport" -U postgres -d postgres \
            -c "SELECT pg_is_in_recovery()" 2>/dev/null) == f ]] && break
        sleep 1
    done
    as_pg "$PG_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$SOCK" -p "$vport" -U postgres -d postgres \
        -c "$CHECK_SQL" > "$LOGDIR/check-restored-$tag.txt" 2>&1 \
        || { cat "$LOGDIR/check-restored-$tag.txt" >&2; die "verify: querying the restored cluster failed ($tag)"; }
    as_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    VERIFY_DATA=""
    if ! diff -u "$LOGDIR/check-source.txt" "$LOGDIR/check-restored-$tag.txt" >&2; then
        die "verify: the cluster restored by pgstrata ($tag) differs from the source (diff above)"
    fi
    log "verify: restored contents match the source ($tag)"
    VERIFIED+=("$tag")
}
VERIFIED=()

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
        printf 'PGS_REPO=%q\nCODEC=%q\nLEVEL=%q\nPGBR_CONFS=%q\n' "$pgs_repo" "$codec" "$level" "$confs" \
            > "$ARCHIVE_ENV.tmp"
        chown postgres:postgres "$ARCHIVE_ENV.tmp"; mv -f "$ARCHIVE_ENV.tmp" "$ARCHIVE_ENV"
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
            verify_restore "$d/restore-pgstrata" "$tag"
        fi
        rm -rf "$d"/restore-*
    done
    ci=$((ci + 1))
done
rm -f "$ARCHIVE_ENV"

# ---------------------------------------------------------------------------------- results
{
    echo "## Full backup and restore: pgstrata vs pgBackRest"
    echo
    echo "- scenario: pgbench -i -s $SCALE + $COPIES copies of pgbench_accounts (CREATE TABLE AS), data checksums on, autovacuum off"
    echo "- database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- process-max $PROCESS_MAX for both tools; each codec at its default level (zst 3, lz4 1, gz 6); start-fast"
    echo "- $("$PGS" version 2>/dev/null | head -n 1); $("$PGBACKREST" version); PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}')"
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
