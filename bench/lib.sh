# bench/lib.sh: shared helpers for the pgstrata vs pgBackRest benchmarks. Source it; do not run it.
#
# The benchmark scripts (full_backup.sh, incremental.sh, restore.sh, bundling.sh) use it like this:
#
#   BENCH_NAME=incremental.sh      # used in messages
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   bench_defaults                 # PORT, PROCESS_MAX, WORKDIR, KEEP, BUILD, ... (before option parsing)
#   ...parse options, using need_arg / bench_common_option...
#   bench_prereqs                  # root, PostgreSQL binaries, pgbench, pgbackrest, jq
#   bench_binary                   # builds pgstrata (unless --no-build / --pgstrata)
#   bench_workdir                  # scratch directory, copies the binary, installs the exit trap
#   init_source_cluster [EXTRA_POSTGRESQL_CONF_LINES]
#
# All PostgreSQL processes and both tools run as the `postgres` OS user (runuser). Timings are
# wall clock (bash EPOCHREALTIME) of the one command.

# ----------------------------------------------------------------------------- messages, args
die() { echo "${BENCH_NAME:-bench}: ERROR: $*" >&2; exit 1; }
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; }
need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "option $1 needs a value (see --help)"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

default_level() {
    case "$1" in zst) echo 3 ;; lz4) echo 1 ;; gz) echo 6 ;; bz2) echo 9 ;; none) echo 0 ;;
        *) return 1 ;; esac
}

# Defaults of the options every script shares. Call before parsing the options.
bench_defaults() {
    PROCESS_MAX=2
    PORT=55432
    WORKDIR=""
    KEEP=0
    BUILD=1
    PGSTRATA_BIN=""
    OUT=""
    PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
    STANZA=bench
    VERIFY_DATA=""
    CLEANED=0
}

# Parse one of the shared options. Sets SHIFT_N to the number of words consumed (0: not ours).
#   --process-max N --port N --workdir DIR --keep --no-build --pgstrata BIN --out FILE
bench_common_option() {
    SHIFT_N=0
    case "$1" in
        --process-max) need_arg "$@"; PROCESS_MAX="$2"; SHIFT_N=2 ;;
        --process-max=*) PROCESS_MAX="${1#*=}"; SHIFT_N=1 ;;
        --port) need_arg "$@"; PORT="$2"; SHIFT_N=2 ;;
        --port=*) PORT="${1#*=}"; SHIFT_N=1 ;;
        --workdir) need_arg "$@"; WORKDIR="$2"; SHIFT_N=2 ;;
        --workdir=*) WORKDIR="${1#*=}"; SHIFT_N=1 ;;
        --keep) KEEP=1; SHIFT_N=1 ;;
        --no-build) BUILD=0; SHIFT_N=1 ;;
        --pgstrata) need_arg "$@"; PGSTRATA_BIN="$2"; BUILD=0; SHIFT_N=2 ;;
        --pgstrata=*) PGSTRATA_BIN="${1#*=}"; BUILD=0; SHIFT_N=1 ;;
        --out) need_arg "$@"; OUT="$2"; SHIFT_N=2 ;;
        --out=*) OUT="${1#*=}"; SHIFT_N=1 ;;
    esac
    return 0
}

check_common_options() {
    is_uint "$PROCESS_MAX" && (( PROCESS_MAX >= 1 )) || die "--process-max must be >= 1, got '$PROCESS_MAX'"
    is_uint "$PORT" && (( PORT > 1024 && PORT < 65535 )) || die "--port must be in 1025..65534, got '$PORT'"
}

# "zst,lz4,gz" -> CODEC_LIST array, each checked.
parse_codecs() {
    IFS=',' read -r -a CODEC_LIST <<< "$1"
    (( ${#CODEC_LIST[@]} > 0 )) || die "--codecs is empty"
    local c
    for c in "${CODEC_LIST[@]}"; do
        default_level "$c" >/dev/null || die "unknown codec '$c' (zst, lz4, gz, bz2, none)"
    done
}

# ---------------------------------------------------------------------------- prerequisites
bench_prereqs() {
    [[ $(id -u) -eq 0 ]] || die "run as root (the clusters and both tools run as the postgres OS user via runuser)"
    id postgres >/dev/null 2>&1 || die "no 'postgres' OS user"
    local b
    for b in initdb pg_ctl postgres psql; do
        [[ -x "$PG_BIN/$b" ]] || die "$PG_BIN/$b not found (set PG_BIN=...)"
    done
    PGBENCH="$PG_BIN/pgbench"; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
    PGBACKREST=$(command -v pgbackrest) || die "pgbackrest not found: apt-get update && apt-get install -y pgbackrest"
    JQ=$(command -v jq) || die "jq not found: apt-get install -y jq"
    [[ -n "${EPOCHREALTIME:-}" ]] || die "bash >= 5 needed (EPOCHREALTIME)"
}

# Build (or locate) the pgstrata binary -> PGSTRATA_BIN.
bench_binary() {
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
}

# ------------------------------------------------------------------------------ scratch dir
# Sets SRC SOCK LOGDIR BIN RUNDIR PGS and installs the traps.
bench_workdir() {
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
    RUNDIR="$WORKDIR/run"         # repositories, configs and restores
    mkdir -p "$SOCK" "$LOGDIR" "$BIN" "$RUNDIR" "$WORKDIR/lock"
    cp "$PGSTRATA_BIN" "$BIN/pgstrata"
    chmod 755 "$BIN/pgstrata"
    PGS="$BIN/pgstrata"
    ARCHIVE_ENV="$BIN/archive.env"
    chown -R postgres:postgres "$WORKDIR"
    cd "$WORKDIR"   # commands run as postgres need a current directory they can access
    trap bench_cleanup EXIT
    trap 'echo "${BENCH_NAME:-bench}: ERROR: command failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR
    trap 'exit 130' INT TERM
}

bench_cleanup() {
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

# --------------------------------------------------------------------------------- helpers
as_pg() { runuser -u postgres -- "$@"; }
psql_src() { as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$PORT" -U postgres "$@"; }
now() { echo "$EPOCHREALTIME"; }
# Flush dirty pages left by earlier steps (repositories, deleted restores) so that no timed
# command pays for another one's writeback. Not part of any timing.
settle() { sync; sleep 1; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
min2() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b + 0 < a + 0) print b; else print a }'; }
# ratio A B = B / A (callers pass pgstrata first, pgBackRest second: > 1 favours pgstrata)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a + 0 == 0) print "n/a"; else printf "%.2f", b / a }'; }
mb() { awk -v b="$1" 'BEGIN { if (b == "") print "n/a"; else printf "%.1f", b / 1048576 }'; }
mb2() { awk -v b="$1" 'BEGIN { if (b == "") print "n/a"; else printf "%.2f", b / 1048576 }'; }
count_files() { find "$1" -type f | wc -l; }

# Run a command as postgres with its stdout/stderr in $LOGDIR/$1.{out,err}; on failure print them.
run_logged() {
    local name="$1"; shift
    if ! as_pg "$@" >"$LOGDIR/$name.out" 2>"$LOGDIR/$name.err"; then
        echo "${BENCH_NAME:-bench}: ERROR: '$name' failed: $*" >&2
        echo "--- stdout ($LOGDIR/$name.out):" >&2; tail -n 40 "$LOGDIR/$name.out" >&2
        echo "--- stderr ($LOGDIR/$name.err):" >&2; tail -n 40 "$LOGDIR/$name.err" >&2
        return 1
    fi
}

# Directory owned by postgres (mode 0700 for data directories).
new_pg_dir() { rm -rf "$1"; mkdir -p "$1"; chown postgres:postgres "$1"; chmod 700 "$1"; }
new_restore_dir() { new_pg_dir "$1"; }

# --------------------------------------------------------------------------- source cluster
# initdb --data-checksums, archive_command pushing to both tools, start. $1: extra
# postgresql.conf lines (optional).
init_source_cluster() {
    local extra="${1:-}"
    log "scratch directory: $WORKDIR"
    log "initdb (data checksums on)"
    run_logged initdb "$PG_BIN/initdb" -D "$SRC" -U postgres --data-checksums -A trust \
        || die "initdb failed"

    # The archive command pushes to both tools. Which repositories it pushes to is read from
    # archive.env at each call, so the benchmark switches repositories without a reload.
    # (pgBackRest refuses to back up unless archive_command contains "pgbackrest": hence the name.)
    cat > "$BIN/archive-pgstrata-and-pgbackrest.sh" <<EOF
#!/bin/bash
# archive_command of the benchmark cluster: push one WAL segment to pgstrata and to pgBackRest.
set -euo pipefail
ENV_FILE="$ARCHIVE_ENV"
[[ -f "\$ENV_FILE" ]] || exit 0     # no repository configured yet: drop the segment
. "\$ENV_FILE"
for repo in \$PGS_REPOS; do
    "$PGS" --stanza=$STANZA --repo-path="\$repo" --compress-type="\$CODEC" --compress-level="\$LEVEL" \\
        --log-path="$LOGDIR" archive-push "\$1"
done
for conf in \$PGBR_CONFS; do
    "$PGBACKREST" --config="\$conf" --stanza=$STANZA archive-push "\$1"
done
EOF
    chmod 755 "$BIN/archive-pgstrata-and-pgbackrest.sh"
    chown postgres:postgres "$BIN/archive-pgstrata-and-pgbackrest.sh"

    cat >> "$SRC/postgresql.conf" <<EOF

# ---- pgstrata benchmark (bench/$BENCH_NAME)
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
$extra
EOF

    log "starting source cluster on port $PORT"
    run_logged pg_ctl_start "$PG_BIN/pg_ctl" -D "$SRC" -l "$LOGDIR/postgres-src.log" -w -t 120 start \
        || die "source cluster did not start (see $LOGDIR/postgres-src.log)"
}

# Point the archive command at repositories (atomically): codec level "pgstrata repos" "pgbr confs".
set_archive_targets() {
    printf 'PGS_REPOS=%q\nCODEC=%q\nLEVEL=%q\nPGBR_CONFS=%q\n' "$3" "$1" "$2" "$4" > "$ARCHIVE_ENV.tmp"
    chown postgres:postgres "$ARCHIVE_ENV.tmp"; mv -f "$ARCHIVE_ENV.tmp" "$ARCHIVE_ENV"
}
clear_archive_targets() { rm -f "$ARCHIVE_ENV"; }

# Switch WAL and wait until the segment just completed has been archived (to both tools), so
# that no archive push of earlier WAL runs during the next timed command. "Archived" is read from
# pg_wal/archive_status: the segment's .done (or the segment already recycled) and no .ready file
# left for it or anything before it. (pg_stat_archiver.last_archived_wal is the most recently
# archived file, not the highest: a .backup file archived after the next segment would hide it.)
wal_switch_and_wait() {
    local seg i st="$SRC/pg_wal/archive_status" r pending
    seg=$(psql_src -d postgres -At -c "SELECT pg_walfile_name(pg_switch_wal())")
    for ((i = 0; i < 1200; i++)); do
        if [[ -f "$st/$seg.done" || ! -f "$SRC/pg_wal/$seg" ]]; then
            pending=""
            for r in "$st"/*.ready; do
                [[ -e "$r" ]] || continue
                r=${r##*/}
                [[ "${r:0:24}" > "${seg:0:24}" ]] || { pending="$r"; break; }
            done
            [[ -z "$pending" ]] && return 0
        fi
        sleep 0.1
    done
    log "warning: WAL segment $seg not archived within 120 s (archive_status: $(ls "$st" 2>&1 | tail -n 3 | tr '\n' ' '))"
}

# pgbench -i -s SCALE, then COPIES x CREATE TABLE <prefix>i AS TABLE pgbench_accounts.
# Sets TABLES (pgbench_accounts and the copies).
load_pgbench_and_copies() {   # scale copies prefix
    local scale="$1" copies="$2" prefix="$3" i
    log "pgbench -i -s $scale"
    run_logged pgbench_init "$PGBENCH" -i -s "$scale" -q -h "$SOCK" -p "$PORT" -U postgres postgres \
        || die "pgbench -i failed"
    TABLES=(pgbench_accounts)
    for ((i = 1; i <= copies; i++)); do
        log "CREATE TABLE $prefix$i AS SELECT * FROM pgbench_accounts"
        psql_src -d postgres -c "CREATE TABLE $prefix$i AS SELECT * FROM pgbench_accounts" \
            || die "creating $prefix$i failed"
        TABLES+=("$prefix$i")
    done
    CHECK_SQL=""
    local t
    for t in "${TABLES[@]}" pgbench_branches pgbench_tellers; do
        [[ -n "$CHECK_SQL" ]] && CHECK_SQL+=" UNION ALL "
        CHECK_SQL+="SELECT '$t', count(*), sum(abs(hashtext(t::text)::bigint)) FROM $t AS t"
    done
    CHECK_SQL="SELECT * FROM ($CHECK_SQL) s ORDER BY 1"
}

# Record what a correct restore of the current state must contain: $LOGDIR/check-$1.txt
record_source_check() {
    psql_src -d postgres -At -c "$CHECK_SQL" > "$LOGDIR/check-$1.txt" || die "reading the tables failed"
}

database_sizes() {   # -> DB_BYTES DATADIR_BYTES
    DB_BYTES=$(psql_src -d postgres -At -c "SELECT sum(pg_database_size(oid)) FROM pg_database")
    DATADIR_BYTES=$(du -sb --exclude=pg_wal "$SRC" | cut -f1)
}

tool_versions() {
    echo "$("$PGS" version 2>/dev/null | head -n 1) (binary sha256 $(sha256sum "$PGS" | cut -c1-12), built $(date -u -r "${PGSTRATA_BIN:-$PGS}" '+%Y-%m-%d %H:%M UTC' 2>/dev/null || echo '?')); $("$PGBACKREST" version); PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}')"
}
machine_line() {
    echo "$(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo) RAM, shared with other work: expect noise"
}

# ------------------------------------------------------------------------------- pgBackRest
# write_pgbr_conf CONF REPO CODEC LEVEL BUNDLE [EXTRA_GLOBAL_LINES]
write_pgbr_conf() {
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
${6:-}

[$STANZA]
pg1-path=$SRC
pg1-socket-path=$SOCK
pg1-port=$PORT
pg1-user=postgres
EOF
    chown postgres:postgres "$1"
}

pgbr_stanza_create() {   # conf tag
    as_pg mkdir -p "$(sed -n 's/^repo1-path=//p' "$1")"
    run_logged "pgbackrest-stanza-create-$2" "$PGBACKREST" --config="$1" --stanza=$STANZA stanza-create \
        || die "pgbackrest stanza-create failed ($2)"
}

time_pgbr_backup() {   # conf tag [type (default full)] -> LAST_SEC, LAST_LABEL
    local conf="$1" tag="$2" type="${3:-full}" t0 t1
    settle
    t0=$(now)
    run_logged "pgbackrest-backup-$tag" "$PGBACKREST" --config="$conf" --stanza=$STANZA --type="$type" backup \
        || die "pgbackrest backup failed ($tag)"
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
    LAST_LABEL=$(pgbr_info_json "$conf" "$tag" | "$JQ" -r '.[0].backup[-1].label')
}

pgbr_info_json() {   # conf tag -> JSON on stdout
    run_logged "pgbackrest-info-$2" "$PGBACKREST" --config="$1" --stanza=$STANZA --output=json info \
        || die "pgbackrest info failed ($2)"
    cat "$LOGDIR/pgbackrest-info-$2.out"
}

time_pgbr_restore() {   # conf dir tag [extra args...] -> LAST_SEC
    local conf="$1" dir="$2" tag="$3" t0 t1
    shift 3
    settle
    t0=$(now)
    run_logged "pgbackrest-restore-$tag" "$PGBACKREST" --config="$conf" --stanza=$STANZA --pg1-path="$dir" "$@" restore \
        || die "pgbackrest restore failed ($tag)"
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
}

# --------------------------------------------------------------------------------- pgstrata
pgs_stanza_create() {   # repo tag
    as_pg mkdir -p "$1"
    run_logged "pgstrata-stanza-create-$2" "$PGS" --stanza=$STANZA --repo-path="$1" --pg-path="$SRC" \
        --pg-host="$SOCK" --pg-port="$PORT" --pg-user=postgres --log-path="$LOGDIR" stanza-create \
        || die "pgstrata stanza-create failed ($2)"
}

time_pgstrata_backup() {   # repo codec level tag [extra args...] -> LAST_SEC, LAST_LABEL
    local repo="$1" codec="$2" level="$3" tag="$4" t0 t1
    shift 4
    settle
    t0=$(now)
    run_logged "pgstrata-backup-$tag" "$PGS" --stanza=$STANZA --repo-path="$repo" --pg-path="$SRC" \
        --pg-host="$SOCK" --pg-port="$PORT" --pg-user=postgres --log-path="$LOGDIR" \
        --compress-type="$codec" --compress-level="$level" --process-max="$PROCESS_MAX" \
        --start-fast "$@" backup || die "pgstrata backup failed ($tag)"
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
    LAST_LABEL=$(grep -v '^[[:space:]]*$' "$LOGDIR/pgstrata-backup-$tag.out" | tail -n 1 | awk '{print $NF}')
    [[ -n "$LAST_LABEL" ]] || die "pgstrata backup printed no label ($LOGDIR/pgstrata-backup-$tag.out)"
}

pgs_info_json() {   # repo tag -> JSON on stdout
    run_logged "pgstrata-info-$2" "$PGS" --stanza=$STANZA --repo-path="$1" --log-path="$LOGDIR" --output=json info \
        || die "pgstrata info failed ($2)"
    cat "$LOGDIR/pgstrata-info-$2.out"
}

time_pgstrata_restore() {   # repo dir tag [extra args...] -> LAST_SEC
    local repo="$1" dir="$2" tag="$3" t0 t1
    shift 3
    settle
    t0=$(now)
    run_logged "pgstrata-restore-$tag" "$PGS" --stanza=$STANZA --repo-path="$repo" --pg-path="$dir" \
        --log-path="$LOGDIR" --process-max="$PROCESS_MAX" "$@" restore \
        || die "pgstrata restore failed ($tag)"
    t1=$(now)
    LAST_SEC=$(elapsed "$t0" "$t1")
}

# --------------------------------------------------------------------------------- verify
# Start a restored cluster, let it replay WAL and promote, and compare its table contents with
# $LOGDIR/check-$3.txt (written by record_source_check). Appends the tag to VERIFIED.
VERIFIED=()
verify_restore() {   # datadir tag expected-check-name
    local data="$1" tag="$2" expect="${3:-source}" vport=$((PORT + 1)) i
    VERIFY_DATA="$data"
    log "verify: starting the restored cluster ($tag) on port $vport"
    rm -f "$data/postmaster.pid"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$LOGDIR/postgres-verify-$tag.log" -w -t 300 \
        -o "-c port=$vport -c archive_mode=off -c unix_socket_directories=$SOCK" start \
        >"$LOGDIR/verify-start-$tag.out" 2>&1; then
        tail -n 30 "$LOGDIR/postgres-verify-$tag.log" >&2
        die "verify: the restored cluster did not start ($tag); log: $LOGDIR/postgres-verify-$tag.log"
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
    if ! diff -u "$LOGDIR/check-$expect.txt" "$LOGDIR/check-restored-$tag.txt" >&2; then
        die "verify: the restored cluster ($tag) differs from the source (diff above)"
    fi
    log "verify: restored contents match the source ($tag)"
    VERIFIED+=("$tag")
}

# Emit results: stdout, and --out FILE.
emit_results() {   # file
    echo
    cat "$1"
    if [[ -n "$OUT" ]]; then
        cp "$1" "$OUT"
        log "results written to $OUT"
    fi
}
