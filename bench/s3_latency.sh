#!/usr/bin/env bash
# bench/s3_latency.sh: pgstrata on an S3 server with added per-request latency, against the same
# runs on a local repository (and pgBackRest 2.45 on the same S3 server, over TLS).
#
# Usage:
#   bench/s3_latency.sh [--scenarios restore,bundling] [--scale N] [--copies N] [--change-pct P]
#                       [--tables N] [--rows N] [--delay-ms MS] [--connect-delay-ms MS]
#                       [--s3-process-max LIST]
#                       [--s3-nodelay] [--pgbackrest y|n] [--pgbr-bundle y|n] [--codec C]
#                       [--process-max N]
#                       [--port N] [--no-wait] [--workdir DIR] [--keep] [--no-build]
#                       [--pgstrata BIN] [--out FILE]
#
#   --scenarios LIST   restore, bundling or both (default restore,bundling)
#   --scale N          restore scenario: pgbench scale (default 20)
#   --copies N         restore scenario: copies test1..testN of pgbench_accounts (default 2)
#   --change-pct P     restore scenario: % of each copy deleted (one contiguous range; default 1)
#   --tables N         bundling scenario: small tables t1..tN (default 500; PGDATA then holds
#                      about 2,300 files. Without bundling every file is one S3 request per
#                      backup and per restore, so at 20 ms and process-max 2 each 1,000 files
#                      cost up to about 15 s per S3 command: 10000 tables, about 31,000 files,
#                      would take close to an hour for all targets)
#   --rows N           bundling scenario: rows per small table (default 1)
#   --delay-ms MS      latency the proxy adds per request/response turn (default 20)
#   --connect-delay-ms MS  latency the proxy adds per new connection (default 0: moto closes
#                      every connection after one response, see bench/delay_proxy.py)
#   --s3-process-max L extra process-max values for additional pgstrata S3 runs through the
#                      delaying proxy, comma-separated, "" for none (default 4)
#   --s3-nodelay       also run pgstrata against moto directly (no proxy): separates the cost
#                      of the S3 server itself from the cost of the latency
#   --pgbackrest y|n   also run pgBackRest, local and on S3 (default y). pgBackRest 2.45 only
#                      speaks https to S3, so its S3 runs go through the proxy's TLS listener
#                      (throwaway CA, repo1-storage-verify-tls=n), with the same delay; the
#                      script then also runs pgstrata through that TLS listener
#                      (repo-s3-ca-file), so the two tools are compared on the same path
#   --pgbr-bundle y|n  pgBackRest's repo1-bundle in the restore scenario (default y: the
#                      setting one would use on an object store; pgstrata bundles by default)
#   --codec C          compression type of every backup, at its default level (default zst)
#   --process-max N    worker count of the local runs and of the main S3 runs (default 2)
#   --port N           port of the throwaway source cluster (default 55442); moto listens on
#                      N+20, the proxy on N+21 (plain) and N+22 (TLS)
#   --no-wait          do not wait for other benchmarks (any other bench/*.sh) to finish first
#   --workdir DIR, --keep, --no-build, --pgstrata BIN, --out FILE: as in the other scripts
#
# What it does (seed 000's restore scenario and seed 003's bundling scenario, scaled down;
# see bench/README.md, section s3_latency.sh):
#   1. builds pgstrata; waits until no other bench/*.sh is doing work (and then counts the timed
#      commands that overlapped CI or another benchmark anyway); starts moto_server (S3) and
#      bench/delay_proxy.py in front of it; initdb --data-checksums and starts PostgreSQL 15.
#      The archive_command pushes each segment to the repositories of the target being
#      measured (switched per target through bin/archive.env, no reload);
#   2. targets, measured one after the other on the same data: pgstrata on a local (posix)
#      repository; pgstrata on S3 through the proxy (http, --delay-ms) with --process-max N and
#      with each --s3-process-max value; optionally pgstrata on S3 without the proxy; with
#      --pgbackrest y: pgBackRest local, pgBackRest on S3 through the TLS listener, and
#      pgstrata through the TLS listener;
#   3. restore scenario: pgbench -i -s SCALE + COPIES copies, VACUUM ANALYZE, CHECKPOINT; per
#      target a timed full backup; DELETE of CHANGE_PCT % of each copy (one contiguous aid
#      range), VACUUM ANALYSE, CHECKPOINT; per target a timed incr backup; per target a timed
#      full restore of the incr into an empty directory, and a timed delta restore of the incr
#      over an (untimed) restore of the full; the two directories are compared (diff -r);
#   4. bundling scenario: the restore scenario's tables are dropped; TABLES tables with ROWS
#      rows each, VACUUM ANALYSE, CHECKPOINT; per target and per variant (bundling on, off)
#      a fresh repository, a timed full backup, the objects it wrote (S3: a ListObjectsV2
#      listing of the backup prefix, straight from moto; local: files in the backup area;
#      after minus before), and a timed restore into an empty directory;
#   5. prints markdown tables: per step, local seconds, S3 seconds and S3 throughput as % of
#      local (= local s / S3 s; the same bytes are moved), and the HTTP requests the step made
#      (request/response turns counted by the proxy).
#
# Requirements: run as root; PostgreSQL 15 in /usr/lib/postgresql/15/bin (or PG_BIN=...);
# pgbench; pgbackrest; jq; python3 (>= 3.8); moto_server (pip install 'moto[server]',
# .ci/setup does); curl; openssl (for --pgbackrest y); cargo (unless --no-build).

set -Eeuo pipefail

BENCH_NAME=s3_latency.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------- options
bench_defaults
PORT=55442
SCENARIOS=restore,bundling
SCALE=20
COPIES=2
CHANGE_PCT=1
NTABLES=500
ROWS_PER_TABLE=1
DELAY_MS=20
CONNECT_DELAY_MS=0
S3_PM_LIST=4
S3_NODELAY=0
PGBR=y
PGBR_BUNDLE=y
CODEC=zst
WAIT=1

while [[ $# -gt 0 ]]; do
    bench_common_option "$@"
    if (( SHIFT_N )); then shift "$SHIFT_N"; continue; fi
    case "$1" in
        --scenarios) need_arg "$@"; SCENARIOS="$2"; shift 2 ;;
        --scenarios=*) SCENARIOS="${1#*=}"; shift ;;
        --scale) need_arg "$@"; SCALE="$2"; shift 2 ;;
        --scale=*) SCALE="${1#*=}"; shift ;;
        --copies) need_arg "$@"; COPIES="$2"; shift 2 ;;
        --copies=*) COPIES="${1#*=}"; shift ;;
        --change-pct) need_arg "$@"; CHANGE_PCT="$2"; shift 2 ;;
        --change-pct=*) CHANGE_PCT="${1#*=}"; shift ;;
        --tables) need_arg "$@"; NTABLES="$2"; shift 2 ;;
        --tables=*) NTABLES="${1#*=}"; shift ;;
        --rows) need_arg "$@"; ROWS_PER_TABLE="$2"; shift 2 ;;
        --rows=*) ROWS_PER_TABLE="${1#*=}"; shift ;;
        --delay-ms) need_arg "$@"; DELAY_MS="$2"; shift 2 ;;
        --delay-ms=*) DELAY_MS="${1#*=}"; shift ;;
        --connect-delay-ms) need_arg "$@"; CONNECT_DELAY_MS="$2"; shift 2 ;;
        --connect-delay-ms=*) CONNECT_DELAY_MS="${1#*=}"; shift ;;
        --s3-process-max) [[ $# -ge 2 ]] || die "--s3-process-max needs a value"; S3_PM_LIST="$2"; shift 2 ;;
        --s3-process-max=*) S3_PM_LIST="${1#*=}"; shift ;;
        --s3-nodelay) S3_NODELAY=1; shift ;;
        --pgbackrest) need_arg "$@"; PGBR="$2"; shift 2 ;;
        --pgbackrest=*) PGBR="${1#*=}"; shift ;;
        --pgbr-bundle) need_arg "$@"; PGBR_BUNDLE="$2"; shift 2 ;;
        --pgbr-bundle=*) PGBR_BUNDLE="${1#*=}"; shift ;;
        --codec) need_arg "$@"; CODEC="$2"; shift 2 ;;
        --codec=*) CODEC="${1#*=}"; shift ;;
        --no-wait) WAIT=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

DO_RESTORE=0; DO_BUNDLING=0
IFS=',' read -r -a _sc <<< "$SCENARIOS"
for s in "${_sc[@]}"; do
    case "$s" in restore) DO_RESTORE=1 ;; bundling) DO_BUNDLING=1 ;; *) die "unknown scenario '$s' (restore, bundling)" ;; esac
done
(( DO_RESTORE + DO_BUNDLING > 0 )) || die "--scenarios is empty"
is_uint "$SCALE" && (( SCALE >= 1 )) || die "--scale must be a positive integer, got '$SCALE'"
is_uint "$COPIES" && (( COPIES >= 1 )) || die "--copies must be >= 1, got '$COPIES'"
is_uint "$CHANGE_PCT" && (( CHANGE_PCT >= 1 && CHANGE_PCT <= 10 )) || die "--change-pct must be 1..10, got '$CHANGE_PCT'"
is_uint "$NTABLES" && (( NTABLES >= 1 )) || die "--tables must be >= 1, got '$NTABLES'"
is_uint "$ROWS_PER_TABLE" || die "--rows must be a non-negative integer, got '$ROWS_PER_TABLE'"
is_uint "$DELAY_MS" || die "--delay-ms must be a non-negative integer, got '$DELAY_MS'"
is_uint "$CONNECT_DELAY_MS" || die "--connect-delay-ms must be a non-negative integer, got '$CONNECT_DELAY_MS'"
[[ $PGBR == y || $PGBR == n ]] || die "--pgbackrest must be y or n, got '$PGBR'"
[[ $PGBR_BUNDLE == y || $PGBR_BUNDLE == n ]] || die "--pgbr-bundle must be y or n, got '$PGBR_BUNDLE'"
LEVEL=$(default_level "$CODEC") || die "unknown codec '$CODEC' (zst, lz4, gz, bz2, none)"
check_common_options
IFS=',' read -r -a S3_PMS <<< "$S3_PM_LIST"
for pm in "${S3_PMS[@]}"; do
    is_uint "$pm" && (( pm >= 1 )) || die "--s3-process-max: '$pm' is not a positive integer"
done
MOTO_PORT=$((PORT + 20)); PROXY_PORT=$((PORT + 21)); TLS_PORT=$((PORT + 22))
BUCKET=pgstrata-bench

bench_prereqs
MOTO=$(command -v moto_server) || die "moto_server not found: pip install 'moto[server]' (bash .ci/setup does)"
PYTHON=$(command -v python3) || die "python3 not found"
command -v curl >/dev/null || die "curl not found"
[[ $PGBR == n ]] || command -v openssl >/dev/null || die "openssl not found (needed for --pgbackrest y)"
bench_binary

# -------------------------------------------------------------------- wait for other benches
CI_NOTE=""
ci_running() { pgrep -f 'cargo (test|build|clippy|nextest)|bin/rustc |/rustc --crate-name' >/dev/null 2>&1; }
# Other benchmark scripts (bench/*.sh other than this one) that are doing something: "pid
# args" lines. A script whose only child is a `sleep` of 5 s or more is itself waiting for
# others (as this one does) and does not count, so that two waiting scripts do not wait for
# each other forever. The wait ends after two clear checks in a row, 20 s apart.
other_benches() {
    local pid args kids
    while read -r pid args; do
        [[ -n "$pid" ]] || continue
        kids=$(ps -o args= --ppid "$pid" 2>/dev/null | grep -v -E '^sleep ([5-9]|[1-9][0-9]+)(\.[0-9]+)?$' || true)
        [[ -n "$kids" ]] && echo "$pid $args"
    done < <(pgrep -fa 'bench/[A-Za-z0-9_]+\.sh' | grep -v -e 's3_latency\.sh' -e 'pgrep' || true)
    return 0
}
if (( WAIT )); then
    waited=0; clear=0
    while (( clear < 2 )); do
        if [[ -z "$(other_benches)" ]]; then
            clear=$((clear + 1)); (( clear < 2 && waited > 0 )) || break
        else
            clear=0
            (( waited == 0 )) && log "waiting for other benchmarks to finish: $(other_benches | cut -c1-120 | tr '\n' ';')"
        fi
        sleep 20; waited=$((waited + 20))
    done
    (( waited > 0 )) && log "waited ${waited}s for other benchmarks"
fi

bench_workdir
PROXY_PID=""; MOTO_PID=""
s3l_cleanup() {
    local rc=$?
    set +e
    if [[ -n "$PROXY_PID" ]]; then kill "$PROXY_PID" 2>/dev/null; wait "$PROXY_PID" 2>/dev/null; fi
    if [[ -n "$MOTO_PID" ]]; then kill "$MOTO_PID" 2>/dev/null; wait "$MOTO_PID" 2>/dev/null; fi
    PROXY_PID=""; MOTO_PID=""
    (exit $rc)
    bench_cleanup
}
trap s3l_cleanup EXIT

# ----------------------------------------------------------------------- S3 server and proxy
# SCRIPT_DIR (the bench directory) was set by bench_binary
PKI="$WORKDIR/pki"
if [[ $PGBR == y ]]; then
    # A CA and a server certificate for 127.0.0.1 signed by it (pgstrata's TLS client does not
    # accept a self-signed CA certificate as the server certificate).
    mkdir -p "$PKI"
    (
        cd "$PKI"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=pgstrata bench CA" \
            -keyout ca.key -out ca.pem -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign"
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr
        printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > ext.cnf
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile ext.cnf -out server.pem
    ) >"$LOGDIR/pki.log" 2>&1 || die "creating the TLS certificates failed ($LOGDIR/pki.log)"
    chmod 644 "$PKI"/ca.pem
fi

log "starting moto_server on 127.0.0.1:$MOTO_PORT"
"$MOTO" -H 127.0.0.1 -p "$MOTO_PORT" >"$LOGDIR/moto.log" 2>&1 &
MOTO_PID=$!
for ((i = 0; i < 300; i++)); do
    code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' -X PUT "http://127.0.0.1:$MOTO_PORT/$BUCKET" || true)
    [[ $code == 200 ]] && break
    kill -0 "$MOTO_PID" 2>/dev/null || die "moto_server exited (see $LOGDIR/moto.log)"
    sleep 0.1
done
[[ $code == 200 ]] || die "moto_server did not come up (last HTTP status '$code'; $LOGDIR/moto.log)"

PROXY_STATS="$WORKDIR/proxy-stats.json"
proxy_args=(--listen "127.0.0.1:$PROXY_PORT" --upstream "127.0.0.1:$MOTO_PORT" --delay-ms "$DELAY_MS"
    --connect-delay-ms "$CONNECT_DELAY_MS" --stats "$PROXY_STATS" --log "$LOGDIR/proxy-requests.log")
[[ $PGBR == y ]] && proxy_args+=(--tls-listen "127.0.0.1:$TLS_PORT" --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key")
log "starting bench/delay_proxy.py: 127.0.0.1:$PROXY_PORT$([[ $PGBR == y ]] && echo " (and TLS 127.0.0.1:$TLS_PORT)") -> moto, ${DELAY_MS} ms per request turn, ${CONNECT_DELAY_MS} ms per new connection"
"$PYTHON" "$SCRIPT_DIR/delay_proxy.py" "${proxy_args[@]}" >"$LOGDIR/proxy.log" 2>&1 &
PROXY_PID=$!
for ((i = 0; i < 100; i++)); do
    code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PROXY_PORT/$BUCKET?list-type=2&max-keys=1" || true)
    [[ $code == 200 ]] && break
    kill -0 "$PROXY_PID" 2>/dev/null || die "delay_proxy.py exited (see $LOGDIR/proxy.log)"
    sleep 0.1
done
[[ $code == 200 ]] || die "delay_proxy.py does not answer (see $LOGDIR/proxy.log)"
# Measured latency of one request (a new connection: connect delay + request delay).
PROBE_DIRECT=$(curl -s --noproxy '*' -o /dev/null -w '%{time_total}' "http://127.0.0.1:$MOTO_PORT/$BUCKET?list-type=2&max-keys=1")
PROBE_PROXY=$(curl -s --noproxy '*' -o /dev/null -w '%{time_total}' "http://127.0.0.1:$PROXY_PORT/$BUCKET?list-type=2&max-keys=1")
log "one ListObjectsV2 on a new connection: ${PROBE_DIRECT}s direct, ${PROBE_PROXY}s through the proxy"

# Proxy counters since its start -> PC ("turns connections"). Asks the proxy for a dump and
# waits for it (not in a subshell: PROXY_SEQ must persist).
PROXY_SEQ=0
proxy_counters() {
    local i
    PROXY_SEQ=$((PROXY_SEQ + 1))
    kill -USR1 "$PROXY_PID"
    for ((i = 0; i < 500; i++)); do
        if [[ -f "$PROXY_STATS" ]] && [[ $("$JQ" -r .seq "$PROXY_STATS" 2>/dev/null) == "$PROXY_SEQ" ]]; then
            PC=$("$JQ" -r '"\(.turns) \(.connections)"' "$PROXY_STATS"); return 0
        fi
        sleep 0.02
    done
    die "delay_proxy.py did not write its counters"
}

# Objects and bytes under a prefix of the bucket: "count bytes" (ListObjectsV2 with
# pagination, straight from moto so that the listing is not counted or delayed).
s3_count() {   # prefix
    "$PYTHON" - "$MOTO_PORT" "$BUCKET" "$1" <<'EOF'
import sys, urllib.parse, urllib.request, xml.etree.ElementTree as ET
port, bucket, prefix = sys.argv[1:4]
ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
n = size = 0
token = None
while True:
    q = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
    if token:
        q["continuation-token"] = token
    with opener.open(f"http://127.0.0.1:{port}/{bucket}?" + urllib.parse.urlencode(q), timeout=120) as r:
        root = ET.fromstring(r.read())
    for c in root.findall("s3:Contents", ns):
        n += 1
        size += int(c.findtext("s3:Size", "0", ns))
    if root.findtext("s3:IsTruncated", "false", ns) == "true":
        token = root.findtext("s3:NextContinuationToken", None, ns)
    else:
        break
print(n, size)
EOF
}

# ----------------------------------------------------------------------------------- targets
# A target is one tool on one repository kind with one process-max.
#   TOOL[t]  pgstrata | pgbackrest        KIND[t]  local | s3
#   PM[t]    process-max                  TNAME[t] column title
TARGETS=(); declare -A TOOL KIND PM TNAME ENDPOINT
add_target() { TARGETS+=("$1"); TOOL[$1]=$2; KIND[$1]=$3; PM[$1]=$4; TNAME[$1]=$5; ENDPOINT[$1]=${6:-}; }
add_target local pgstrata local "$PROCESS_MAX" "local"
add_target s3 pgstrata s3 "$PROCESS_MAX" "S3+${DELAY_MS}ms" "http://127.0.0.1:$PROXY_PORT"
for pm in "${S3_PMS[@]}"; do
    [[ $pm == "$PROCESS_MAX" ]] && continue
    add_target "s3-pm$pm" pgstrata s3 "$pm" "S3+${DELAY_MS}ms pm$pm" "http://127.0.0.1:$PROXY_PORT"
done
(( S3_NODELAY )) && add_target s3-direct pgstrata s3 "$PROCESS_MAX" "S3 no delay" "http://127.0.0.1:$MOTO_PORT"
if [[ $PGBR == y ]]; then
    add_target s3-tls pgstrata s3 "$PROCESS_MAX" "S3+${DELAY_MS}ms https" "https://127.0.0.1:$TLS_PORT"
    add_target pgbr-local pgbackrest local "$PROCESS_MAX" "pgBackRest local"
    add_target pgbr-s3 pgbackrest s3 "$PROCESS_MAX" "pgBackRest S3+${DELAY_MS}ms https" "127.0.0.1"
fi

# Configuration of target $1 in repository "instance" $2 (a tag): writes $RUNDIR/$2.conf (pgstrata
# TOML / pgBackRest ini) and sets CONFF and AREA (how to count the backup's objects:
# "dir:PATH" or "s3:PREFIX").
make_config() {   # target tag [bundle y|n]
    local t="$1" tag="$2" bundle="${3:-y}" f="$RUNDIR/$2.conf" prefix="bench-$2"
    if [[ ${TOOL[$t]} == pgstrata ]]; then
        {
            echo "[global]"
            if [[ ${KIND[$t]} == local ]]; then
                echo "repo-path = \"$RUNDIR/repo-$tag\""
                AREA="dir:$RUNDIR/repo-$tag/$STANZA/backup"
            else
                echo 'repo-type = "s3"'
                echo "repo-path = \"/$prefix\""
                echo "repo-s3-bucket = \"$BUCKET\""
                echo "repo-s3-endpoint = \"${ENDPOINT[$t]}\""
                echo 'repo-s3-region = "us-east-1"'
                echo 'repo-s3-uri-style = "path"'
                echo 'repo-s3-key = "test"'
                echo 'repo-s3-key-secret = "test"'
                [[ ${ENDPOINT[$t]} == https:* ]] && echo "repo-s3-ca-file = \"$PKI/ca.pem\""
                AREA="s3:$prefix/$STANZA/backup/"
            fi
            echo "compress-type = \"$CODEC\""
            echo "compress-level = $LEVEL"
            echo "process-max = ${PM[$t]}"
            echo "log-path = \"$LOGDIR\""
            echo
            echo "[$STANZA]"
            echo "pg-path = \"$SRC\""
            echo "pg-host = \"$SOCK\""
            echo "pg-port = $PORT"
            echo 'pg-user = "postgres"'
        } > "$f"
    else
        local extra=""
        if [[ ${KIND[$t]} == local ]]; then
            write_pgbr_conf "$f" "$RUNDIR/repo-$tag" "$CODEC" "$LEVEL" "$bundle"
            AREA="dir:$RUNDIR/repo-$tag/backup/$STANZA"
        else
            extra=$(printf '%s\n' repo1-type=s3 "repo1-s3-bucket=$BUCKET" "repo1-s3-endpoint=${ENDPOINT[$t]}" \
                "repo1-storage-port=$TLS_PORT" repo1-storage-verify-tls=n repo1-s3-region=us-east-1 \
                repo1-s3-uri-style=path repo1-s3-key=test repo1-s3-key-secret=test)
            write_pgbr_conf "$f" "/$prefix" "$CODEC" "$LEVEL" "$bundle" "$extra"
            AREA="s3:$prefix/backup/$STANZA/"
        fi
        sed -i "s/^process-max=.*/process-max=${PM[$t]}/" "$f"
    fi
    chown postgres:postgres "$f"; chmod 600 "$f"
    CONFF="$f"
}

count_area() {   # AREA -> "objects bytes"
    case "$1" in
        dir:*) if [[ -d "${1#dir:}" ]]; then echo "$(count_files "${1#dir:}") $(du -sb "${1#dir:}" | cut -f1)"; else echo "0 0"; fi ;;
        s3:*) s3_count "${1#s3:}" ;;
    esac
}

stanza_create() {   # target conf tag
    local t="$1" conf="$2" tag="$3"
    if [[ ${TOOL[$t]} == pgstrata ]]; then
        [[ ${KIND[$t]} == local ]] && as_pg mkdir -p "$RUNDIR/repo-$tag"
        run_logged "stanza-create-$tag" "$PGS" --config="$conf" --stanza=$STANZA stanza-create \
            || die "pgstrata stanza-create failed ($tag)"
    else
        [[ ${KIND[$t]} == local ]] && as_pg mkdir -p "$RUNDIR/repo-$tag"
        run_logged "stanza-create-$tag" "$PGBACKREST" --config="$conf" --stanza=$STANZA stanza-create \
            || die "pgbackrest stanza-create failed ($tag)"
    fi
}

# Requests of turns FIRST..LAST in the proxy's log, by kind: "GET 12, PUT 3, LIST 2, ...".
req_mix() {   # first last
    awk -v a="$1" -v b="$2" '$3 >= a && $3 <= b {
            m = $4; if (m == "GET" && $5 ~ /list-type=2/) m = "LIST"; else if (m == "POST" && $5 ~ /[?&]delete/) m = "DELETE-MULTI"
            n[m]++ }
        END { s = ""; for (k in n) s = s (s == "" ? "" : ", ") k " " n[k]; print s }' "$LOGDIR/proxy-requests.log"
}

# Counting concurrent load: how many timed commands started while cargo/rustc was running.
TIMED=0; TIMED_CI=0; TIMED_OTHER=0; OTHER_SEEN=""; LOADS=()
before_timed() {
    settle
    TIMED=$((TIMED + 1))
    if ci_running; then TIMED_CI=$((TIMED_CI + 1)); fi
    if [[ -n "$(other_benches)" ]]; then TIMED_OTHER=$((TIMED_OTHER + 1)); OTHER_SEEN+=" $(other_benches | awk '{print $3}' | sort -u | tr '\n' ' ')"; fi
    LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
    REQ0=""
    if [[ ${KIND[$1]} == s3 ]]; then proxy_counters; REQ0="$PC"; fi
    T0=$(now)
}
after_timed() {
    local t1; t1=$(now)
    LAST_SEC=$(elapsed "$T0" "$t1")
    LAST_REQ=""; LAST_CONN=""; LAST_MIX=""
    if [[ -n "$REQ0" ]]; then
        local r1 a b c d
        proxy_counters; r1="$PC"; read -r a b <<< "$REQ0"; read -r c d <<< "$r1"
        LAST_REQ=$((c - a)); LAST_CONN=$((d - b))
        # The direct (no-proxy) target and the pgBackRest archive pushes of other targets do not
        # go through the proxy; only proxied targets get a request count.
        if [[ ${ENDPOINT[$1]} == *":$MOTO_PORT" ]]; then
            LAST_REQ=""; LAST_CONN=""
        else
            # turns a+1..c of proxy-requests.log belong to this command
            echo "$2 $((a + 1)) $c" >> "$LOGDIR/proxy-requests.index"
            LAST_MIX=$(req_mix $((a + 1)) "$c")
        fi
    fi
    return 0
}

time_backup() {   # target conf tag type [extra args] -> LAST_SEC LAST_LABEL LAST_REQ
    local t="$1" conf="$2" tag="$3" type="$4"
    shift 4
    before_timed "$t"
    if [[ ${TOOL[$t]} == pgstrata ]]; then
        run_logged "backup-$tag-$type" "$PGS" --config="$conf" --stanza=$STANZA --start-fast \
            --type="$type" "$@" backup || die "pgstrata backup failed ($tag $type)"
    else
        run_logged "backup-$tag-$type" "$PGBACKREST" --config="$conf" --stanza=$STANZA --type="$type" backup \
            || die "pgbackrest backup failed ($tag $type)"
    fi
    after_timed "$t" "backup-$tag-$type"
    if [[ ${TOOL[$t]} == pgstrata ]]; then
        LAST_LABEL=$(grep -v '^[[:space:]]*$' "$LOGDIR/backup-$tag-$type.out" | tail -n 1 | awk '{print $NF}')
    else
        LAST_LABEL=$(pgbr_info_json "$conf" "$tag-$type" | "$JQ" -r '.[0].backup[-1].label')
    fi
    [[ -n "$LAST_LABEL" && "$LAST_LABEL" != null ]] || die "no backup label ($tag $type; $LOGDIR/backup-$tag-$type.out)"
}

time_restore() {   # target conf dir logname [extra args] -> LAST_SEC LAST_REQ
    local t="$1" conf="$2" dir="$3" name="$4"
    shift 4
    before_timed "$t"
    if [[ ${TOOL[$t]} == pgstrata ]]; then
        run_logged "restore-$name" "$PGS" --config="$conf" --stanza=$STANZA --pg-path="$dir" "$@" restore \
            || die "pgstrata restore failed ($name)"
    else
        run_logged "restore-$name" "$PGBACKREST" --config="$conf" --stanza=$STANZA --pg1-path="$dir" "$@" restore \
            || die "pgbackrest restore failed ($name)"
    fi
    after_timed "$t" "restore-$name"
}

# ---------------------------------------------------------------------------- source cluster
# Like lib.sh's init_source_cluster, but the archive command pushes with --config files:
# PGS_CONFS (pgstrata) and PGBR_CONFS (pgBackRest) from $ARCHIVE_ENV.
log "scratch directory: $WORKDIR"
log "initdb (data checksums on)"
run_logged initdb "$PG_BIN/initdb" -D "$SRC" -U postgres --data-checksums -A trust || die "initdb failed"
cat > "$BIN/archive-pgstrata-and-pgbackrest.sh" <<EOF
#!/bin/bash
# archive_command of the benchmark cluster: push one WAL segment to the repositories of the
# target being measured (none when $ARCHIVE_ENV does not exist).
set -euo pipefail
[[ -f "$ARCHIVE_ENV" ]] || exit 0
. "$ARCHIVE_ENV"
for conf in \$PGS_CONFS; do "$PGS" --config="\$conf" --stanza=$STANZA archive-push "\$1"; done
for conf in \$PGBR_CONFS; do "$PGBACKREST" --config="\$conf" --stanza=$STANZA archive-push "\$1"; done
EOF
chmod 755 "$BIN/archive-pgstrata-and-pgbackrest.sh"; chown postgres:postgres "$BIN/archive-pgstrata-and-pgbackrest.sh"
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
max_locks_per_transaction = 1024
EOF
log "starting source cluster on port $PORT"
run_logged pg_ctl_start "$PG_BIN/pg_ctl" -D "$SRC" -l "$LOGDIR/postgres-src.log" -w -t 120 start \
    || die "source cluster did not start (see $LOGDIR/postgres-src.log)"

archive_to() {   # target conf  (archive only to this target's repository)
    local pgs="" pgbr=""
    if [[ ${TOOL[$1]} == pgstrata ]]; then pgs="$2"; else pgbr="$2"; fi
    printf 'PGS_CONFS=%q\nPGBR_CONFS=%q\n' "$pgs" "$pgbr" > "$ARCHIVE_ENV.tmp"
    chown postgres:postgres "$ARCHIVE_ENV.tmp"; mv -f "$ARCHIVE_ENV.tmp" "$ARCHIVE_ENV"
}

# Like lib.sh's wal_switch_and_wait, but "archived" is read from archive_status: segment .done
# and no .ready left. (pg_stat_archiver's last_archived_wal is the most recent one archived, not
# the highest: when pgBackRest's backup completes segment N+1 while N's .backup file is still
# queued, the archiver pushes N+1 before N.backup, and lib.sh's check then waits its full
# 120 s for N+1, which is already archived.) Logs a diagnostic when archiving stalls.
WAL_STALLS=0
wal_switch_and_wait() {
    local seg i last st="$SRC/pg_wal/archive_status"
    seg=$(psql_src -d postgres -At -c "SELECT pg_walfile_name(pg_switch_wal())")
    for ((i = 0; i < 1200; i++)); do
        if ! compgen -G "$st/*.ready" >/dev/null; then
            [[ -f "$st/$seg.done" || ! -f "$SRC/pg_wal/$seg" ]] && return 0
            last=$(psql_src -d postgres -At -c "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")
            [[ -n "$last" && ! "${last:0:24}" < "${seg:0:24}" ]] && return 0
        fi
        if (( i == 150 )); then
            WAL_STALLS=$((WAL_STALLS + 1))
            {
                echo "== $(date +%T) waiting for $seg (archive.env: $(tr '\n' ' ' < "$ARCHIVE_ENV" 2>/dev/null))"
                psql_src -d postgres -c "SELECT * FROM pg_stat_archiver" 2>&1
                ls -l "$SRC/pg_wal/archive_status" 2>&1 | tail -n 5
                ps -eo pid,ppid,etimes,args --forest | grep -A4 '[a]rchiver' | cut -c1-250
            } >> "$LOGDIR/archive-stalls.txt"
            log "warning: WAL segment $seg not archived after 15 s (diagnostic in $LOGDIR/archive-stalls.txt)"
        fi
        sleep 0.1
    done
    log "warning: WAL segment $seg not archived within 120 s (see $LOGDIR/archive-stalls.txt)"
}

declare -A RES      # RES[scenario-step,target] = seconds ; REQ[...] = requests ; OBJ[...] = objects
declare -A REQ OBJ OBYTES MIX
record() {   # key target
    RES[$1,$2]="$LAST_SEC"; REQ[$1,$2]="$LAST_REQ"; MIX[$1,$2]="$LAST_MIX"
    log "[${TNAME[$2]}] $1: ${LAST_SEC}s$([[ -n "$LAST_REQ" ]] && echo ", $LAST_REQ requests ($LAST_MIX), $LAST_CONN connections")"
}

# ------------------------------------------------------------------------- restore scenario
if (( DO_RESTORE )); then
    load_pgbench_and_copies "$SCALE" "$COPIES" test
    ROWS=$((SCALE * 100000)); CHUNK=$((ROWS * CHANGE_PCT / 100))
    log "VACUUM ANALYZE, CHECKPOINT"
    psql_src -d postgres -c "VACUUM ANALYZE" || die "VACUUM ANALYZE failed"
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
    database_sizes; R_DB_BYTES=$DB_BYTES; R_DATADIR_BYTES=$DATADIR_BYTES
    log "database size: $(mb "$DB_BYTES") MB; data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"

    declare -A RCONF RLABEL_FULL RLABEL_INCR RSAME RFETCH
    for t in "${TARGETS[@]}"; do
        make_config "$t" "r-$t" "$PGBR_BUNDLE"; RCONF[$t]="$CONFF"
        stanza_create "$t" "${RCONF[$t]}" "r-$t"
        archive_to "$t" "${RCONF[$t]}"
        wal_switch_and_wait
        log "[${TNAME[$t]}] full backup"
        time_backup "$t" "${RCONF[$t]}" "r-$t" full
        record r-full "$t"; RLABEL_FULL[$t]="$LAST_LABEL"
    done
    clear_archive_targets

    sql=""
    for ((i = 1; i <= COPIES; i++)); do
        frac=$(( (5 + 13 * (i - 1)) % (100 - CHANGE_PCT) ))
        a=$(( ROWS * frac / 100 + 1 ))
        sql+="DELETE FROM test$i WHERE aid BETWEEN $a AND $((a + CHUNK - 1)); "
    done
    log "change: $sql"
    psql_src -d postgres -c "$sql" >"$LOGDIR/change.out" || die "DELETE failed"
    psql_src -d postgres -c "VACUUM ANALYSE" || die "VACUUM ANALYSE failed"
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"

    for t in "${TARGETS[@]}"; do
        archive_to "$t" "${RCONF[$t]}"
        wal_switch_and_wait
        log "[${TNAME[$t]}] incr backup"
        time_backup "$t" "${RCONF[$t]}" "r-$t" incr
        record r-incr "$t"; RLABEL_INCR[$t]="$LAST_LABEL"
    done
    clear_archive_targets

    for t in "${TARGETS[@]}"; do
        full_dir="$RUNDIR/restore-full"; delta_dir="$RUNDIR/restore-delta"
        new_restore_dir "$full_dir"; new_restore_dir "$delta_dir"
        log "[${TNAME[$t]}] full restore of the incr into an empty directory"
        time_restore "$t" "${RCONF[$t]}" "$full_dir" "r-$t-full" --set="${RLABEL_INCR[$t]}"
        record r-restore-full "$t"
        log "[${TNAME[$t]}] restore of the full (preparing the delta restore; not part of the table)"
        time_restore "$t" "${RCONF[$t]}" "$delta_dir" "r-$t-prep" --set="${RLABEL_FULL[$t]}"
        record r-restore-prep "$t"
        log "[${TNAME[$t]}] delta restore of the incr"
        if [[ ${TOOL[$t]} == pgstrata ]]; then
            time_restore "$t" "${RCONF[$t]}" "$delta_dir" "r-$t-delta" --delta --set="${RLABEL_INCR[$t]}"
            RFETCH[$t]=$(sed -n 's/.*; \([0-9]*\) bytes fetched.*/\1/p' "$LOGDIR/restore-r-$t-delta.out")
        else
            time_restore "$t" "${RCONF[$t]}" "$delta_dir" "r-$t-delta" --delta --set="${RLABEL_INCR[$t]}"
        fi
        record r-restore-delta "$t"
        # A delta restore must give the same files as a full restore of the same backup.
        if diff -r --no-dereference --exclude=postgresql.auto.conf "$full_dir" "$delta_dir" > "$LOGDIR/diff-r-$t.txt" 2>&1; then
            RSAME[$t]=yes
        else
            RSAME[$t]=NO; log "ERROR: [${TNAME[$t]}] delta restore differs from the full restore (see $LOGDIR/diff-r-$t.txt)"
        fi
        rm -rf "$full_dir" "$delta_dir"
    done

    log "dropping the restore scenario's tables"
    drop="DROP TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history"
    for ((i = 1; i <= COPIES; i++)); do drop+=", test$i"; done
    psql_src -d postgres -c "$drop" || die "DROP TABLE failed"
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
fi

# ------------------------------------------------------------------------ bundling scenario
BVARIANTS=(on off)
if (( DO_BUNDLING )); then
    BATCH=500
    log "creating $NTABLES tables with $ROWS_PER_TABLE row(s) each, $BATCH per transaction"
    for ((first = 1; first <= NTABLES; first += BATCH)); do
        last=$((first + BATCH - 1)); (( last > NTABLES )) && last=$NTABLES
        psql_src -d postgres -c "DO \$\$ BEGIN FOR i IN $first..$last LOOP
            EXECUTE format('CREATE TABLE t%s (id int)', i);
            IF $ROWS_PER_TABLE > 0 THEN
                EXECUTE format('INSERT INTO t%s SELECT generate_series(1, $ROWS_PER_TABLE)', i);
            END IF;
        END LOOP; END \$\$" || die "creating tables $first..$last failed"
    done
    log "VACUUM ANALYSE, CHECKPOINT"
    psql_src -d postgres -c "VACUUM ANALYSE" || die "VACUUM ANALYSE failed"
    psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
    database_sizes; B_DB_BYTES=$DB_BYTES; B_DATADIR_BYTES=$DATADIR_BYTES
    B_FILES=$(find "$SRC" -type f | wc -l)
    log "database size: $(mb "$DB_BYTES") MB; $B_FILES files in PGDATA"

    for t in "${TARGETS[@]}"; do
        for bv in "${BVARIANTS[@]}"; do
            tag="b$bv-$t"
            make_config "$t" "$tag" "$([[ $bv == on ]] && echo y || echo n)"; conf="$CONFF"; area="$AREA"
            stanza_create "$t" "$conf" "$tag"
            archive_to "$t" "$conf"
            psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
            wal_switch_and_wait
            read -r o0 b0 < <(count_area "$area")
            extra=()
            [[ ${TOOL[$t]} == pgstrata ]] && extra=(--bundle="$([[ $bv == on ]] && echo true || echo false)")
            log "[${TNAME[$t]}] full backup, bundling $bv"
            time_backup "$t" "$conf" "$tag" full "${extra[@]}"
            record "b-$bv-backup" "$t"; label="$LAST_LABEL"
            read -r o1 b1 < <(count_area "$area")
            OBJ[b-$bv,$t]=$((o1 - o0)); OBYTES[b-$bv,$t]=$((b1 - b0))
            log "[${TNAME[$t]}] bundling $bv: ${OBJ[b-$bv,$t]} objects written, $(mb "${OBYTES[b-$bv,$t]}") MB"
            clear_archive_targets
            rdir="$RUNDIR/restore-b"; new_restore_dir "$rdir"
            log "[${TNAME[$t]}] restore, bundling $bv"
            time_restore "$t" "$conf" "$rdir" "$tag" --set="$label"
            record "b-$bv-restore" "$t"
            log "[${TNAME[$t]}] restored $(find "$rdir" -type f | wc -l) files"
            rm -rf "$rdir"
            [[ ${KIND[$t]} == local ]] && rm -rf "$RUNDIR/repo-$tag"
        done
    done
fi
clear_archive_targets

# ---------------------------------------------------------------------------------- results
pct() { awk -v l="$1" -v s="$2" 'BEGIN { if (l == "" || s == "" || s + 0 == 0) print "n/a"; else printf "%.0f %%", 100 * l / s }'; }
x() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a + 0 == 0) print "n/a"; else printf "%.2f", b / a }'; }
meets() { awk -v l="$1" -v s="$2" 'BEGIN { if (l == "" || s == "" || s + 0 == 0) print "n/a"; else if (100 * l / s >= 70) print "yes"; else print "**no**" }'; }
STEPS=()
if (( DO_RESTORE )); then
    STEPS+=("r-full|restore scenario: full backup" "r-incr|restore scenario: incr backup (after ${CHANGE_PCT} % change)"
        "r-restore-full|restore scenario: full restore of the incr" "r-restore-delta|restore scenario: delta restore of the incr")
fi
if (( DO_BUNDLING )); then
    STEPS+=("b-on-backup|bundling scenario: full backup, bundling on" "b-off-backup|bundling scenario: full backup, --bundle=false"
        "b-on-restore|bundling scenario: restore, bundling on" "b-off-restore|bundling scenario: restore, --bundle=false")
fi
S3T=(); for t in "${TARGETS[@]}"; do [[ ${TOOL[$t]} == pgstrata && ${KIND[$t]} == s3 ]] && S3T+=("$t"); done
{
    echo "## pgstrata on S3 with ${DELAY_MS} ms per request vs a local repository"
    echo
    echo "- S3 server: moto_server $("$PYTHON" -c 'import moto; print(moto.__version__)' 2>/dev/null) on 127.0.0.1, behind bench/delay_proxy.py: +${DELAY_MS} ms before each request/response turn, +${CONNECT_DELAY_MS} ms per new connection (moto closes the connection after every response); bandwidth not limited (one ListObjectsV2 on a new connection: ${PROBE_DIRECT}s direct, ${PROBE_PROXY}s through the proxy)"
    (( DO_RESTORE )) && echo "- restore scenario: pgbench -i -s $SCALE + $COPIES copies; database $(mb "$R_DB_BYTES") MB (pg_database_size), data directory without pg_wal $(mb "$R_DATADIR_BYTES") MB; DELETE of $CHANGE_PCT % of each copy ($CHUNK rows, one contiguous range), VACUUM ANALYSE"
    (( DO_BUNDLING )) && echo "- bundling scenario: $NTABLES tables with $ROWS_PER_TABLE row(s) each, VACUUM ANALYSE; $B_FILES files in PGDATA; database $(mb "$B_DB_BYTES") MB"
    echo "- codec $CODEC level $LEVEL; process-max $PROCESS_MAX unless the column says otherwise; start-fast; pgstrata's default bundling unless --bundle=false"
    echo "- $(tool_versions)"
    echo "- each step timed once (wall clock of the command), targets one after the other on the same data; warm page cache; sync; sleep 1 before each timed command"
    echo "- S3 throughput as % of local = local seconds / S3 seconds (the same data is moved); target: >= 70 %"
    echo "- requests: HTTP request/response turns the command made through the proxy (counted by the proxy)"
    echo "- machine: $(machine_line); $TIMED_CI of $TIMED timed commands started while cargo/rustc (CI) was running, $TIMED_OTHER while another benchmark was running$([[ -n "$OTHER_SEEN" ]] && echo " ($(tr ' ' '\n' <<< "$OTHER_SEEN" | sort -u | tr '\n' ' '| sed 's/^ *//;s/ *$//'))"); 1-min load average at the timed commands: min $(printf '%s\n' "${LOADS[@]}" | sort -g | head -n1), max $(printf '%s\n' "${LOADS[@]}" | sort -g | tail -n1)"
    echo
    hdr="| scenario | local s |"; sep="|---|---:|"
    for t in "${S3T[@]}"; do hdr+=" ${TNAME[$t]} s | ${TNAME[$t]} % of local | requests |"; sep+="---:|---:|---:|"; done
    echo "$hdr"; echo "$sep"
    for st in "${STEPS[@]}"; do
        k="${st%%|*}"; title="${st#*|}"
        line="| $title | ${RES[$k,local]} |"
        for t in "${S3T[@]}"; do line+=" ${RES[$k,$t]} | $(pct "${RES[$k,local]}" "${RES[$k,$t]}") | ${REQ[$k,$t]:-} |"; done
        echo "$line"
    done
    echo
    echo "70 % target (S3+${DELAY_MS}ms, process-max $PROCESS_MAX, vs local): $(for st in "${STEPS[@]}"; do k="${st%%|*}"; printf '%s %s; ' "${st#*|}" "$(meets "${RES[$k,local]}" "${RES[$k,s3]}")"; done)"
    if (( DO_BUNDLING )); then
        echo
        echo "Objects written by the full backup (files in the local backup area / objects listed under the S3 backup prefix; after minus before):"
        echo
        hdr="| variant |"; sep="|---|"
        for t in "${TARGETS[@]}"; do hdr+=" ${TNAME[$t]} |"; sep+="---:|"; done
        echo "$hdr"; echo "$sep"
        for bv in "${BVARIANTS[@]}"; do
            line="| bundling $bv |"
            for t in "${TARGETS[@]}"; do line+=" ${OBJ[b-$bv,$t]} ($(mb "${OBYTES[b-$bv,$t]}") MB) |"; done
            echo "$line"
        done
    fi
    if (( DO_RESTORE )); then
        echo
        echo "Restore scenario detail: delta restore = full restore of the same backup (diff -r): $(for t in "${TARGETS[@]}"; do printf '%s %s; ' "${TNAME[$t]}" "${RSAME[$t]}"; done)"
        echo "pgstrata delta restore, bytes fetched: $(for t in "${TARGETS[@]}"; do [[ ${TOOL[$t]} == pgstrata ]] && printf '%s %s; ' "${TNAME[$t]}" "${RFETCH[$t]}"; done)"
        echo "restore of the full before the delta restore (s, requests): $(for t in "${TARGETS[@]}"; do printf '%s %s%s; ' "${TNAME[$t]}" "${RES[r-restore-prep,$t]}" "$([[ -n "${REQ[r-restore-prep,$t]:-}" ]] && echo " (${REQ[r-restore-prep,$t]})")"; done)"
    fi
    echo
    echo "Requests per step through the proxy, by kind (LIST = ListObjectsV2; the WAL archiving a backup waits for is included; every request of every target is in log/proxy-requests.log of the scratch directory, kept with --keep; log/proxy-requests.index maps commands to request numbers):"
    echo
    for t in s3 pgbr-s3; do
        [[ -n "${TOOL[$t]:-}" ]] || continue
        for st in "${STEPS[@]}" "r-restore-prep|restore scenario: restore of the full before the delta restore"; do
            k="${st%%|*}"
            [[ -n "${RES[$k,$t]:-}" ]] || continue
            echo "- ${TNAME[$t]}, ${st#*|}: ${REQ[$k,$t]} requests (${MIX[$k,$t]})"
        done
    done
    if [[ $PGBR == y ]]; then
        echo
        echo "pgBackRest 2.45 on the same S3 server. It only speaks https to S3, so both tools go through the proxy's TLS listener here (same ${DELAY_MS} ms per turn); ratio = pgBackRest s / pgstrata s (> 1: pgstrata faster):"
        echo
        echo "| scenario | pgBackRest local s | pgBackRest S3 https s | pgBackRest S3 % of local | pgBackRest requests | pgstrata S3 https s | pgstrata S3 https % of local | pgstrata requests | ratio on S3 |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        for st in "${STEPS[@]}"; do
            k="${st%%|*}"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "${st#*|}" "${RES[$k,pgbr-local]}" "${RES[$k,pgbr-s3]}" \
                "$(pct "${RES[$k,pgbr-local]}" "${RES[$k,pgbr-s3]}")" "${REQ[$k,pgbr-s3]:-}" "${RES[$k,s3-tls]}" \
                "$(pct "${RES[$k,local]}" "${RES[$k,s3-tls]}")" "${REQ[$k,s3-tls]:-}" "$(x "${RES[$k,s3-tls]}" "${RES[$k,pgbr-s3]}")"
        done
        echo
        echo "(pgBackRest 2.45's incremental backups are file-level, pgstrata's block-level. Restore scenario: pgBackRest repo1-bundle=$PGBR_BUNDLE. Bundling scenario: repo1-bundle=y / n.)"
    fi
} > "$WORKDIR/results.md"

emit_results "$WORKDIR/results.md"
if (( DO_RESTORE )); then
    for t in "${TARGETS[@]}"; do
        [[ ${RSAME[$t]} == yes ]] || die "${TNAME[$t]}: delta restore and full restore of the same backup differ (see $LOGDIR/diff-r-$t.txt)"
    done
fi
