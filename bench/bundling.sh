#!/usr/bin/env bash
# bench/bundling.sh: full backup of a cluster with tens of thousands of small tables, with and
# without bundling of small files: pgstrata vs pgBackRest 2.45, side by side.
#
# Usage:
#   bench/bundling.sh [--tables N] [--rows N] [--scale N] [--variants LIST] [--codec C]
#                     [--runs N] [--no-restore] [--verify] [--process-max N] [--port N]
#                     [--workdir DIR] [--keep] [--no-build] [--pgstrata BIN] [--out FILE]
#
#   --tables N         small tables t1..tN (default 20000)
#   --rows N           rows inserted into each small table (default 1; 0 leaves empty files)
#   --scale N          also pgbench -i -s N (default 0: no pgbench data)
#   --variants LIST    comma-separated bundling variants, each applied to both tools
#                      (default off,default):
#                        off          pgstrata --bundle=false; pgBackRest repo1-bundle=n
#                        default      pgstrata bundle=true with its default limit/size
#                                     (2MiB/16MiB); pgBackRest repo1-bundle=y with its default
#                                     limit/size (2MiB/20MiB)
#                        LIMIT:SIZE   bundling on, both tools with --bundle-limit=LIMIT
#                                     --bundle-size=SIZE (e.g. 2MiB:10MiB)
#   --codec C          compression type, at its default level (default zst)
#   --runs N           repeat each backup (and restore) N times in fresh repositories and keep
#                      the best (minimum) time (default 1)
#   --no-restore       do not time a restore of each backup into an empty directory
#   --verify           start the cluster pgstrata restored (first run of each variant) and
#                      compare the number of small tables and their row sums with the source
#   --process-max N    worker count given to both tools, for backup and restore (default 2)
#   --port N           port of the throwaway source cluster (default 55432; N+1 for --verify)
#   --workdir DIR      scratch directory (default: mktemp -d under /var/tmp); must not exist
#   --keep             keep the scratch directory (repositories, logs) at the end
#   --no-build         do not run cargo build; use the existing release binary
#   --pgstrata BIN     pgstrata binary to use (implies --no-build)
#   --out FILE         also write the results (markdown) to FILE
#
# What it does (scenario "seed 003", scaled down; see bench/README.md):
#   1. builds pgstrata, initdb --data-checksums, starts PostgreSQL 15 with an archive_command that
#      pushes every segment to both tools;
#   2. creates N tables `CREATE TABLE tI (id int)` with ROWS rows each, 500 tables per
#      transaction (DO blocks); optional pgbench data; VACUUM ANALYSE (gives each table a _fsm
#      and a _vm fork: about 3 small files per table), CHECKPOINT;
#   3. per variant (and run): fresh repositories, stanza-create, a timed full backup with each
#      tool (order alternates), objects written by the backup (files in the backup area after
#      the backup minus before it: pgstrata REPO/<stanza>/backup, pgBackRest
#      REPO/backup/<stanza>), du -sb of the backup area, and a timed restore into an empty
#      directory;
#   4. prints markdown tables with pgBackRest/pgstrata ratios.
#
# Requirements: run as root; PostgreSQL 15 in /usr/lib/postgresql/15/bin (or PG_BIN=...);
# pgbench; pgbackrest; jq; cargo (unless --no-build). Helpers: bench/lib.sh.

set -Eeuo pipefail

BENCH_NAME=bundling.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------- options
bench_defaults
NTABLES=20000
ROWS_PER_TABLE=1
SCALE=0
VARIANT_LIST="off,default"
CODEC=zst
RUNS=1
RESTORE=1
VERIFY=0

while [[ $# -gt 0 ]]; do
    bench_common_option "$@"
    if (( SHIFT_N )); then shift "$SHIFT_N"; continue; fi
    case "$1" in
        --tables) need_arg "$@"; NTABLES="$2"; shift 2 ;;
        --tables=*) NTABLES="${1#*=}"; shift ;;
        --rows) need_arg "$@"; ROWS_PER_TABLE="$2"; shift 2 ;;
        --rows=*) ROWS_PER_TABLE="${1#*=}"; shift ;;
        --scale) need_arg "$@"; SCALE="$2"; shift 2 ;;
        --scale=*) SCALE="${1#*=}"; shift ;;
        --variants) need_arg "$@"; VARIANT_LIST="$2"; shift 2 ;;
        --variants=*) VARIANT_LIST="${1#*=}"; shift ;;
        --codec) need_arg "$@"; CODEC="$2"; shift 2 ;;
        --codec=*) CODEC="${1#*=}"; shift ;;
        --runs) need_arg "$@"; RUNS="$2"; shift 2 ;;
        --runs=*) RUNS="${1#*=}"; shift ;;
        --no-restore) RESTORE=0; shift ;;
        --verify) VERIFY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

is_uint "$NTABLES" && (( NTABLES >= 1 )) || die "--tables must be >= 1, got '$NTABLES'"
is_uint "$ROWS_PER_TABLE" || die "--rows must be a non-negative integer, got '$ROWS_PER_TABLE'"
is_uint "$SCALE" || die "--scale must be a non-negative integer, got '$SCALE'"
is_uint "$RUNS" && (( RUNS >= 1 )) || die "--runs must be >= 1, got '$RUNS'"
LEVEL=$(default_level "$CODEC") || die "unknown codec '$CODEC' (zst, lz4, gz, bz2, none)"
check_common_options
IFS=',' read -r -a VARIANTS <<< "$VARIANT_LIST"
(( ${#VARIANTS[@]} > 0 )) || die "--variants is empty"
size_re='^[0-9]+(B|KiB|MiB|GiB)$'
for v in "${VARIANTS[@]}"; do
    case "$v" in
        off|default) ;;
        *:*) [[ "${v%%:*}" =~ $size_re && "${v#*:}" =~ $size_re ]] \
                 || die "variant '$v': LIMIT and SIZE must look like 2MiB, 512KiB, 1GiB" ;;
        *) die "unknown variant '$v' (off, default, LIMIT:SIZE)" ;;
    esac
done
variant_title() {
    case "$1" in
        off) echo "no bundling" ;;
        default) echo "bundling, each tool's defaults" ;;
        *) echo "bundling, limit=${1%%:*} size=${1#*:}" ;;
    esac
}

bench_prereqs
bench_binary
bench_workdir

# --------------------------------------------------------------------------- source cluster
init_source_cluster "max_locks_per_transaction = 1024"
if (( SCALE > 0 )); then
    log "pgbench -i -s $SCALE"
    run_logged pgbench_init "$PGBENCH" -i -s "$SCALE" -q -h "$SOCK" -p "$PORT" -U postgres postgres \
        || die "pgbench -i failed"
fi
BATCH=500
log "creating $NTABLES tables with $ROWS_PER_TABLE row(s) each, $BATCH per transaction"
t0=$(now)
for ((first = 1; first <= NTABLES; first += BATCH)); do
    last=$((first + BATCH - 1)); (( last > NTABLES )) && last=$NTABLES
    psql_src -d postgres -c "DO \$\$ BEGIN FOR i IN $first..$last LOOP
        EXECUTE format('CREATE TABLE t%s (id int)', i);
        IF $ROWS_PER_TABLE > 0 THEN
            EXECUTE format('INSERT INTO t%s SELECT generate_series(1, $ROWS_PER_TABLE)', i);
        END IF;
    END LOOP; END \$\$" || die "creating tables $first..$last failed"
done
log "tables created in $(elapsed "$t0" "$(now)")s"
# A check a restore must pass: number of small tables, and the sum of their row counts.
psql_src -d postgres -c "CREATE FUNCTION bench_small_tables_check(OUT tables bigint, OUT rows_total bigint)
    LANGUAGE plpgsql AS \$\$ DECLARE r record; n bigint; BEGIN
        tables := 0; rows_total := 0;
        FOR r IN SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ '^t[0-9]+\$' LOOP
            EXECUTE format('SELECT count(*) FROM %I', r.relname) INTO n;
            tables := tables + 1; rows_total := rows_total + n;
        END LOOP; END \$\$" || die "creating the check function failed"
CHECK_SQL="SELECT * FROM bench_small_tables_check()"
log "VACUUM ANALYSE, CHECKPOINT"
psql_src -d postgres -c "VACUUM ANALYSE" || die "VACUUM ANALYSE failed"
record_source_check source
psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
database_sizes
PGDATA_FILES=$(find "$SRC" -type f | wc -l)
log "database size: $(mb "$DB_BYTES") MB; data directory without pg_wal: $(mb "$DATADIR_BYTES") MB; $PGDATA_FILES files in PGDATA; check: $(cat "$LOGDIR/check-source.txt")"

# ------------------------------------------------------------------------------ measurement
declare -A T R OBJ SZ
pgs_variant_args() {
    case "$1" in
        off) echo "--bundle=false" ;;
        default) echo "--bundle=true" ;;
        *) echo "--bundle=true --bundle-limit=${1%%:*} --bundle-size=${1#*:}" ;;
    esac
}
pgbr_variant_bundle() { [[ $1 == off ]] && echo n || echo y; }
pgbr_variant_lines() {
    case "$1" in off|default) ;; *) printf 'repo1-bundle-limit=%s\nrepo1-bundle-size=%s\n' "${1%%:*}" "${1#*:}" ;; esac
}
count_or_zero() { if [[ -d "$1" ]]; then count_files "$1"; else echo 0; fi; }

vi=0
for variant in "${VARIANTS[@]}"; do
    for ((run = 1; run <= RUNS; run++)); do
        tag="${variant//:/-}-r$run"
        d="$RUNDIR/$tag"
        mkdir -p "$d"; chown postgres:postgres "$d"
        pgs_repo="$d/repo-pgstrata"
        conf="$d/pgbackrest.conf"
        write_pgbr_conf "$conf" "$d/repo-pgbackrest" "$CODEC" "$LEVEL" "$(pgbr_variant_bundle "$variant")" \
            "$(pgbr_variant_lines "$variant")"
        log "[$tag] stanza-create (pgstrata, pgBackRest)"
        pgs_stanza_create "$pgs_repo" "$tag"
        pgbr_stanza_create "$conf" "$tag"
        set_archive_targets "$CODEC" "$LEVEL" "$pgs_repo" "$conf"
        if (( ! KEEP )); then
            for old in "$RUNDIR"/*; do [[ "$old" != "$d" ]] && rm -rf "$old"; done
        fi
        psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
        wal_switch_and_wait
        pgs_area="$pgs_repo/$STANZA/backup"
        pgbr_area="$d/repo-pgbackrest/backup/$STANZA"
        pgs_before=$(count_or_zero "$pgs_area"); pgbr_before=$(count_or_zero "$pgbr_area")

        order=(pgstrata pgbackrest)
        if (( (vi + run) % 2 == 0 )); then order=(pgbackrest pgstrata); fi
        read -r -a pgs_args <<< "$(pgs_variant_args "$variant")"
        for tool in "${order[@]}"; do
            if [[ $tool == pgstrata ]]; then
                log "[$tag] pgstrata backup --type=full ${pgs_args[*]}"
                time_pgstrata_backup "$pgs_repo" "$CODEC" "$LEVEL" "$tag" --type=full "${pgs_args[@]}"
                PGS_LABEL="$LAST_LABEL"
            else
                log "[$tag] pgbackrest backup --type=full (repo1-bundle=$(pgbr_variant_bundle "$variant") $(pgbr_variant_lines "$variant" | tr '\n' ' '))"
                time_pgbr_backup "$conf" "$tag" full
            fi
            T[$tool,$variant]=$(min2 "${T[$tool,$variant]:-}" "$LAST_SEC")
            log "[$tag] $tool backup: ${LAST_SEC}s"
        done
        OBJ[pgstrata,$variant]=$(( $(count_or_zero "$pgs_area") - pgs_before ))
        OBJ[pgbackrest,$variant]=$(( $(count_or_zero "$pgbr_area") - pgbr_before ))
        SZ[pgstrata,$variant]=$(du -sb "$pgs_area" | cut -f1)
        SZ[pgbackrest,$variant]=$(du -sb "$pgbr_area" | cut -f1)
        log "[$tag] objects written: pgstrata ${OBJ[pgstrata,$variant]}, pgbackrest ${OBJ[pgbackrest,$variant]}; backup area bytes: pgstrata ${SZ[pgstrata,$variant]}, pgbackrest ${SZ[pgbackrest,$variant]}"

        if (( RESTORE )); then
            for tool in "${order[@]}"; do
                rdir="$d/restore-$tool"; new_restore_dir "$rdir"
                if [[ $tool == pgstrata ]]; then
                    log "[$tag] pgstrata restore"
                    time_pgstrata_restore "$pgs_repo" "$rdir" "$tag" --set="$PGS_LABEL"
                else
                    log "[$tag] pgbackrest restore"
                    time_pgbr_restore "$conf" "$rdir" "$tag"
                fi
                R[$tool,$variant]=$(min2 "${R[$tool,$variant]:-}" "$LAST_SEC")
                log "[$tag] $tool restore: ${LAST_SEC}s ($(find "$rdir" -type f | wc -l) files)"
            done
            if (( VERIFY )) && (( run == 1 )); then
                verify_restore "$d/restore-pgstrata" "$tag" source
            fi
            rm -rf "$d"/restore-*
        fi
    done
    vi=$((vi + 1))
done
clear_archive_targets

# ---------------------------------------------------------------------------------- results
{
    echo "## Many small tables: full backup with and without bundling, pgstrata vs pgBackRest 2.45"
    echo
    echo "- scenario: $NTABLES tables \`CREATE TABLE tI (id int)\` with $ROWS_PER_TABLE row(s) each$( (( SCALE > 0 )) && echo ", plus pgbench -i -s $SCALE"); VACUUM ANALYSE; CHECKPOINT"
    echo "- files in PGDATA: $PGDATA_FILES; database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- codec $CODEC level $LEVEL; process-max $PROCESS_MAX for both tools; start-fast; local repositories"
    echo "- $(tool_versions)"
    echo "- times: wall clock of the command, best of $RUNS run(s), fresh repositories per run; warm page cache; sync before each timed command"
    echo "- objects: files the backup added to the backup area (pgstrata REPO/$STANZA/backup, pgBackRest REPO/backup/$STANZA, incl. manifests and backup.info)"
    echo "- ratio = pgBackRest / pgstrata (> 1: pgstrata faster or fewer objects)"
    echo "- machine: $(machine_line)"
    echo
    hdr="| variant | pgstrata backup s | pgBackRest backup s | ratio | pgstrata objects | pgBackRest objects | ratio | pgstrata backup MB | pgBackRest backup MB |"
    sep="|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    if (( RESTORE )); then hdr+=" pgstrata restore s | pgBackRest restore s | ratio |"; sep+="---:|---:|---:|"; fi
    echo "$hdr"; echo "$sep"
    for variant in "${VARIANTS[@]}"; do
        p="pgstrata,$variant"; k="pgbackrest,$variant"
        line=$(printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |' "$(variant_title "$variant")" \
            "${T[$p]}" "${T[$k]}" "$(ratio "${T[$p]}" "${T[$k]}")" \
            "${OBJ[$p]}" "${OBJ[$k]}" "$(ratio "${OBJ[$p]}" "${OBJ[$k]}")" \
            "$(mb "${SZ[$p]}")" "$(mb "${SZ[$k]}")")
        if (( RESTORE )); then
            line+=$(printf ' %s | %s | %s |' "${R[$p]}" "${R[$k]}" "$(ratio "${R[$p]}" "${R[$k]}")")
        fi
        echo "$line"
    done
    echo
    echo "Seed 003's shape (backup time, objects written in parentheses):"
    echo
    hdr="| tool | files in PGDATA | database size |"; sep="|---|---:|---:|"
    for variant in "${VARIANTS[@]}"; do hdr+=" $(variant_title "$variant") |"; sep+="---:|"; done
    echo "$hdr"; echo "$sep"
    for tool in pgstrata pgbackrest; do
        line="| $([[ $tool == pgstrata ]] && echo pgstrata || echo pgBackRest) | $PGDATA_FILES | $(mb "$DB_BYTES") MB |"
        for variant in "${VARIANTS[@]}"; do line+=" ${T[$tool,$variant]}s (${OBJ[$tool,$variant]}) |"; done
        echo "$line"
    done
    if (( VERIFY )); then
        echo
        echo "Verified (restored by pgstrata, started, WAL replayed, small-table count and row total equal to the source): ${VERIFIED[*]}"
    fi
} > "$WORKDIR/results.md"

emit_results "$WORKDIR/results.md"
