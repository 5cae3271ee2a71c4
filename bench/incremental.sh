#!/usr/bin/env bash
# bench/incremental.sh: full backup, then an incremental backup after a 1 % change, per codec:
# pgstrata (block-level incremental) vs pgBackRest 2.45 (file-level incremental), side by side.
#
# Usage:
#   bench/incremental.sh [--scale N] [--copies N] [--change-pct P] [--codecs gz,lz4,zst]
#                        [--runs N] [--pgbr-bundle n|y] [--process-max N] [--verify] [--port N]
#                        [--workdir DIR] [--keep] [--no-build] [--pgstrata BIN] [--out FILE]
#
#   --scale N          pgbench scale factor (default 20; 1 scale = 100,000 rows, ~13 MB heap)
#   --copies N         copies of pgbench_accounts, test1..testN (default 4)
#   --change-pct P     rows deleted from each copy, in percent, as one contiguous aid range
#                      (default 1)
#   --codecs LIST      comma-separated compression types, each at its default level
#                      (zst 3, lz4 1, gz 6; also none, bz2) (default gz,lz4,zst)
#   --runs N           repeat the full + change + incr cycle N times per codec, each in fresh
#                      repositories, and keep the best (minimum) time of each column (default 1)
#   --pgbr-bundle V    pgBackRest repo1-bundle: n (pgBackRest default) or y (default n)
#   --process-max N    worker count given to both tools (default 2)
#   --verify           restore pgstrata's incremental backup of the first run of each codec,
#                      start it (WAL replay through pgstrata archive-get) and compare row
#                      counts/sums with the source after the change
#   --port N           port of the throwaway source cluster (default 55432; N+1 for --verify)
#   --workdir DIR      scratch directory (default: mktemp -d under /var/tmp); must not exist
#   --keep             keep the scratch directory (repositories, logs) at the end
#   --no-build         do not run cargo build; use the existing release binary
#   --pgstrata BIN     pgstrata binary to use (implies --no-build)
#   --out FILE         also write the results (markdown) to FILE
#
# What it does (scenario "seed 000", backup part; see bench/README.md):
#   1. builds pgstrata (release, CARGO_TARGET_DIR=target/bench), initdb --data-checksums, starts
#      PostgreSQL 15 with an archive_command that pushes every segment to both tools;
#   2. pgbench -i -s SCALE, COPIES x CREATE TABLE testI AS SELECT * FROM pgbench_accounts;
#   3. per codec (and run): fresh repositories and stanza-create for both tools; VACUUM ANALYZE,
#      CHECKPOINT; a timed full backup with each tool (order alternates); then
#      DELETE FROM testI WHERE aid BETWEEN a AND a+P%-1 for every copy (a different range per
#      codec/run), VACUUM ANALYSE, CHECKPOINT; a timed incremental backup with each tool;
#   4. stored size of each backup: pgstrata `info --output=json` stored_size (new data this
#      backup stored), pgBackRest `info --output=json` backup[].info.repository.delta
#      ("backup size": what this backup wrote to the repository); du -sb of each backup's own
#      directory is logged as a cross-check;
#   5. prints markdown tables with pgBackRest/pgstrata ratios (> 1: pgstrata faster/smaller).
#
# pgBackRest 2.45 has no block-level incremental (repo1-block came in 2.46), so its incremental
# is file-level: a changed 1 GB segment file is stored again whole. Compared here is what each
# tool has: pgBackRest file-level incr vs pgstrata block-level incr.
#
# Requirements: run as root; PostgreSQL 15 in /usr/lib/postgresql/15/bin (or PG_BIN=...);
# pgbench; pgbackrest; jq; cargo (unless --no-build). Helpers: bench/lib.sh.

set -Eeuo pipefail

BENCH_NAME=incremental.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------- options
bench_defaults
SCALE=20
COPIES=4
CHANGE_PCT=1
CODECS="gz,lz4,zst"
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
        --change-pct) need_arg "$@"; CHANGE_PCT="$2"; shift 2 ;;
        --change-pct=*) CHANGE_PCT="${1#*=}"; shift ;;
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
is_uint "$COPIES" && (( COPIES >= 1 )) || die "--copies must be >= 1, got '$COPIES'"
is_uint "$CHANGE_PCT" && (( CHANGE_PCT >= 1 && CHANGE_PCT <= 10 )) || die "--change-pct must be an integer 1..10, got '$CHANGE_PCT'"
is_uint "$RUNS" && (( RUNS >= 1 )) || die "--runs must be >= 1, got '$RUNS'"
[[ "$PGBR_BUNDLE" == n || "$PGBR_BUNDLE" == y ]] || die "--pgbr-bundle must be n or y, got '$PGBR_BUNDLE'"
check_common_options
parse_codecs "$CODECS"

bench_prereqs
bench_binary
bench_workdir

# --------------------------------------------------------------------------- source cluster
init_source_cluster
load_pgbench_and_copies "$SCALE" "$COPIES" test
ROWS=$((SCALE * 100000))
CHUNK=$((ROWS * CHANGE_PCT / 100))
log "VACUUM ANALYZE, reading all tables once, CHECKPOINT"
psql_src -d postgres -c "VACUUM ANALYZE" || die "VACUUM ANALYZE failed"
record_source_check initial
psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
database_sizes
log "database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"

# Delete CHANGE_PCT % of every copy as one contiguous aid range. $1 numbers the change, so that
# every change hits rows that are still there (ranges never overlap for $1 < 100/CHANGE_PCT).
CHANGES=0
apply_change() {
    local n="$1" i frac a sql=""
    for ((i = 1; i <= COPIES; i++)); do
        # start of the range, in percent: spread over the table, different per copy and change
        frac=$(( (5 + 13 * (i - 1) + 37 * n) % (100 - CHANGE_PCT) ))
        a=$(( ROWS * frac / 100 + 1 ))
        sql+="DELETE FROM test$i WHERE aid BETWEEN $a AND $((a + CHUNK - 1)); "
    done
    log "change #$n: $sql"
    psql_src -d postgres -c "$sql" >"$LOGDIR/change-$n.out" || die "DELETE failed"
    psql_src -d postgres -c "VACUUM ANALYSE" || die "VACUUM ANALYSE failed"
    CHANGES=$((CHANGES + 1))
}

# ------------------------------------------------------------------------------ measurement
# FT/IT[tool,codec] = best full/incr backup s; FS/IS = stored bytes (from the first run);
# IR = bytes read by pgstrata's incr / pgBackRest's "database backup size" of the incr
declare -A FT IT FS IS IDU FDU IREAD IFILES label_pgs label_pgbr
PGBR=pgbackrest-b$PGBR_BUNDLE

pgs_backup_field() {   # json label field
    "$JQ" -r --arg l "$2" --arg f "$3" '(.backups // .[0].backups)[] | select(.label == $l) | .[$f]' <<< "$1"
}
pgbr_backup_field() {   # json label jq-path
    "$JQ" -r --arg l "$2" ".[0].backup[] | select(.label == \$l) | $3" <<< "$1"
}

ci=0
n_change=0
for codec in "${CODEC_LIST[@]}"; do
    level=$(default_level "$codec")
    for ((run = 1; run <= RUNS; run++)); do
        tag="$codec-r$run"
        d="$RUNDIR/$tag"
        mkdir -p "$d"; chown postgres:postgres "$d"
        pgs_repo="$d/repo-pgstrata"
        conf="$d/pgbackrest.conf"
        write_pgbr_conf "$conf" "$d/repo-pgbackrest" "$codec" "$level" "$PGBR_BUNDLE"
        log "[$tag] stanza-create (pgstrata, pgBackRest)"
        pgs_stanza_create "$pgs_repo" "$tag"
        pgbr_stanza_create "$conf" "$tag"
        set_archive_targets "$codec" "$level" "$pgs_repo" "$conf"
        if (( ! KEEP )); then
            for old in "$RUNDIR"/*; do [[ "$old" != "$d" ]] && rm -rf "$old"; done
        fi

        order=(pgstrata pgbackrest)
        if (( (ci + run) % 2 == 0 )); then order=(pgbackrest pgstrata); fi

        # Settled state before the full: VACUUM ANALYZE (sets the visibility map everywhere),
        # CHECKPOINT, WAL switched and archived, so neither tool's timing includes them.
        psql_src -d postgres -c "VACUUM ANALYZE" || die "VACUUM ANALYZE failed"
        psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
        wal_switch_and_wait

        for kind in full incr; do
            for tool in "${order[@]}"; do
                if [[ $tool == pgstrata ]]; then
                    log "[$tag] pgstrata backup --type=$kind"
                    time_pgstrata_backup "$pgs_repo" "$codec" "$level" "$tag-$kind" --type="$kind"
                    label_pgs[$kind]="$LAST_LABEL"
                else
                    log "[$tag] pgbackrest backup --type=$kind (repo1-bundle=$PGBR_BUNDLE)"
                    time_pgbr_backup "$conf" "$tag-$kind" "$kind"
                    label_pgbr[$kind]="$LAST_LABEL"
                fi
                log "[$tag] $tool $kind backup: ${LAST_SEC}s, label $LAST_LABEL"
                if [[ $kind == full ]]; then
                    FT[$tool,$codec]=$(min2 "${FT[$tool,$codec]:-}" "$LAST_SEC")
                else
                    IT[$tool,$codec]=$(min2 "${IT[$tool,$codec]:-}" "$LAST_SEC")
                fi
            done
            if [[ $kind == full ]]; then
                # The change between the two backups, then the same settling as before the full.
                apply_change "$n_change"; n_change=$((n_change + 1))
                if (( VERIFY )) && (( run == 1 )); then record_source_check "after-$tag"; fi
                psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
                wal_switch_and_wait
            fi
        done

        # Sizes, from each tool's info, plus du of each backup's own directory.
        pj=$(pgs_info_json "$pgs_repo" "$tag")
        bj=$(pgbr_info_json "$conf" "$tag")
        [[ $(pgs_backup_field "$pj" "${label_pgs[incr]}" type) == incr ]] \
            || die "pgstrata backup ${label_pgs[incr]} is not an incr: $(pgs_backup_field "$pj" "${label_pgs[incr]}" type)"
        [[ $(pgbr_backup_field "$bj" "${label_pgbr[incr]}" .type) == incr ]] \
            || die "pgBackRest backup ${label_pgbr[incr]} is not an incr"
        if (( run == 1 )); then
            FS[pgstrata,$codec]=$(pgs_backup_field "$pj" "${label_pgs[full]}" stored_size)
            IS[pgstrata,$codec]=$(pgs_backup_field "$pj" "${label_pgs[incr]}" stored_size)
            IREAD[pgstrata,$codec]=$(pgs_backup_field "$pj" "${label_pgs[incr]}" bytes_read)
            IFILES[pgstrata,$codec]="$(pgs_backup_field "$pj" "${label_pgs[incr]}" files_unchanged)/$(pgs_backup_field "$pj" "${label_pgs[incr]}" files)"
            FS[pgbackrest,$codec]=$(pgbr_backup_field "$bj" "${label_pgbr[full]}" .info.repository.delta)
            IS[pgbackrest,$codec]=$(pgbr_backup_field "$bj" "${label_pgbr[incr]}" .info.repository.delta)
            IREAD[pgbackrest,$codec]=$(pgbr_backup_field "$bj" "${label_pgbr[incr]}" .info.delta)
            FDU[pgstrata,$codec]=$(du -sb "$pgs_repo/$STANZA/backup/${label_pgs[full]}" | cut -f1)
            IDU[pgstrata,$codec]=$(du -sb "$pgs_repo/$STANZA/backup/${label_pgs[incr]}" | cut -f1)
            FDU[pgbackrest,$codec]=$(du -sb "$d/repo-pgbackrest/backup/$STANZA/${label_pgbr[full]}" | cut -f1)
            IDU[pgbackrest,$codec]=$(du -sb "$d/repo-pgbackrest/backup/$STANZA/${label_pgbr[incr]}" | cut -f1)
            log "[$tag] stored: pgstrata full ${FS[pgstrata,$codec]} (du ${FDU[pgstrata,$codec]}), incr ${IS[pgstrata,$codec]} (du ${IDU[pgstrata,$codec]}), read ${IREAD[pgstrata,$codec]}, unchanged/files ${IFILES[pgstrata,$codec]}"
            log "[$tag] stored: pgbackrest full ${FS[pgbackrest,$codec]} (du ${FDU[pgbackrest,$codec]}), incr ${IS[pgbackrest,$codec]} (du ${IDU[pgbackrest,$codec]}), database backup size ${IREAD[pgbackrest,$codec]}"
        fi

        if (( VERIFY )) && (( run == 1 )); then
            rdir="$d/restore-pgstrata"; new_restore_dir "$rdir"
            log "[$tag] verify: pgstrata restore --set=${label_pgs[incr]}"
            time_pgstrata_restore "$pgs_repo" "$rdir" "$tag-verify" --set="${label_pgs[incr]}"
            verify_restore "$rdir" "$tag" "after-$tag"
            rm -rf "$rdir"
        fi
    done
    ci=$((ci + 1))
done
clear_archive_targets

# ---------------------------------------------------------------------------------- results
{
    echo "## Incremental backup after a $CHANGE_PCT % change: pgstrata (block-level) vs pgBackRest 2.45 (file-level)"
    echo
    echo "- scenario: pgbench -i -s $SCALE + $COPIES copies test1..test$COPIES of pgbench_accounts; VACUUM ANALYZE + CHECKPOINT; full backup;"
    echo "  DELETE of $CHANGE_PCT % of each copy as one contiguous aid range ($CHUNK rows), VACUUM ANALYSE, CHECKPOINT; incremental backup"
    echo "- database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- process-max $PROCESS_MAX for both tools; each codec at its default level; start-fast; pgBackRest repo1-bundle=$PGBR_BUNDLE"
    echo "- $(tool_versions)"
    echo "- times: wall clock of the command, best of $RUNS run(s), fresh repositories per run; warm page cache; sync before each timed command"
    echo "- stored MB: what the backup itself wrote (pgstrata: info stored_size; pgBackRest: info backup[].info.repository.delta, \"backup size\")"
    echo "- ratio = pgBackRest / pgstrata (> 1: pgstrata faster or smaller)"
    echo "- machine: $(machine_line)"
    echo
    echo "| codec | full s pgstrata | full s pgBackRest | ratio | full MB pgstrata | full MB pgBackRest | ratio | incr s pgstrata | incr s pgBackRest | ratio | incr MB pgstrata | incr MB pgBackRest | ratio |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for codec in "${CODEC_LIST[@]}"; do
        p="pgstrata,$codec"; k="pgbackrest,$codec"
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$codec" \
            "${FT[$p]}" "${FT[$k]}" "$(ratio "${FT[$p]}" "${FT[$k]}")" \
            "$(mb "${FS[$p]}")" "$(mb "${FS[$k]}")" "$(ratio "${FS[$p]}" "${FS[$k]}")" \
            "${IT[$p]}" "${IT[$k]}" "$(ratio "${IT[$p]}" "${IT[$k]}")" \
            "$(mb2 "${IS[$p]}")" "$(mb2 "${IS[$k]}")" "$(ratio "${IS[$p]}" "${IS[$k]}")"
    done
    echo
    echo "Incremental backup detail (first run of each codec):"
    echo
    echo "| codec | pgstrata incr/full stored | pgBackRest incr/full stored | pgstrata bytes read MB | pgstrata files unchanged/total | pgBackRest files copied MB (database backup size) | pgstrata incr dir du MB | pgBackRest incr dir du MB |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for codec in "${CODEC_LIST[@]}"; do
        p="pgstrata,$codec"; k="pgbackrest,$codec"
        printf '| %s | %s %% | %s %% | %s | %s | %s | %s | %s |\n' "$codec" \
            "$(awk -v a="${IS[$p]}" -v b="${FS[$p]}" 'BEGIN { printf "%.2f", 100 * a / b }')" \
            "$(awk -v a="${IS[$k]}" -v b="${FS[$k]}" 'BEGIN { printf "%.2f", 100 * a / b }')" \
            "$(mb "${IREAD[$p]}")" "${IFILES[$p]}" "$(mb "${IREAD[$k]}")" \
            "$(mb2 "${IDU[$p]}")" "$(mb2 "${IDU[$k]}")"
    done
    if (( VERIFY )); then
        echo
        echo "Verified (pgstrata's incr restored, started, WAL replayed, table contents equal to the source after the change): ${VERIFIED[*]}"
    fi
} > "$WORKDIR/results.md"

emit_results "$WORKDIR/results.md"
