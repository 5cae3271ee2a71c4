#!/usr/bin/env bash
# bench/incremental.sh: full backup, then an incremental backup after a 1 % change, per codec:
# pgstrata (block-level incremental) vs pgBackRest 2.45 (file-level incremental), side by side.
#
# Usage:
#   bench/incremental.sh [--scale N] [--copies N] [--change-pct P] [--codecs gz,lz4,zst]
#                        [--runs N] [--pgbr-bundle n|y] [--track LIST] [--process-max N] [--verify]
#                        [--port N] [--workdir DIR] [--keep] [--no-build] [--pgstrata BIN] [--out FILE]
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
#   --track LIST       pgstrata incremental modes, comma-separated, each in its own repository
#                      with its own full backup (default auto,hash):
#                        auto   pgstrata's default: the block-change maps archive-push writes
#                               from WAL when they cover the window, else hashing
#                        wal    only the blocks the maps list are read
#                        hash   changed files (size/mtime) are read and hashed whole
#                        none   pass no --track (pgstrata builds without the option)
#   --process-max N    worker count given to both tools (default 2)
#   --verify           restore pgstrata's incr backups (every mode) of the first run of each codec,
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
#      (pgstrata: one repository per --track mode, all backed up in turn);
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
TRACKS="auto,hash"
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
        --track) need_arg "$@"; TRACKS="$2"; shift 2 ;;
        --track=*) TRACKS="${1#*=}"; shift ;;
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
IFS=',' read -r -a TRACK_LIST <<< "$TRACKS"
(( ${#TRACK_LIST[@]} > 0 )) || die "--track is empty"
for tr in "${TRACK_LIST[@]}"; do
    case "$tr" in auto|wal|hash|none) ;; *) die "unknown --track mode '$tr' (auto, wal, hash, none)" ;; esac
done

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
# Tool ids: pgs-TRACK (one pgstrata repository per --track mode) and pgbackrest.
# FT/IT[id,codec] = best full/incr backup s; FS/IS = stored bytes (first run); IREAD = bytes the
# incr read (pgstrata bytes_read; pgBackRest "database backup size", the bytes of the files it
# copied); IFILES = pgstrata files unchanged/total; TRK = pgstrata's track used (and why not wal)
declare -A FT IT FS IS IDU FDU IREAD IFILES TRK LABEL
PGS_IDS=()
for tr in "${TRACK_LIST[@]}"; do PGS_IDS+=("pgs-$tr"); done
pgs_track_args() { [[ ${1#pgs-} == none ]] || echo "--track=${1#pgs-}"; }
id_name() {
    case "$1" in
        pgbackrest) echo "pgBackRest" ;;
        pgs-none) echo "pgstrata" ;;
        *) echo "pgstrata --track=${1#pgs-}" ;;
    esac
}

pgs_backup_field() {   # json label field
    "$JQ" -r --arg l "$2" --arg f "$3" '(.backups // .[0].backups)[] | select(.label == $l) | .[$f] // ""' <<< "$1"
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
        conf="$d/pgbackrest.conf"
        write_pgbr_conf "$conf" "$d/repo-pgbackrest" "$codec" "$level" "$PGBR_BUNDLE"
        log "[$tag] stanza-create (pgstrata x ${#PGS_IDS[@]}, pgBackRest)"
        pgs_repos=""
        for id in "${PGS_IDS[@]}"; do
            pgs_stanza_create "$d/repo-$id" "$tag-$id"
            pgs_repos+="$d/repo-$id "
        done
        pgbr_stanza_create "$conf" "$tag"
        set_archive_targets "$codec" "$level" "$pgs_repos" "$conf"
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
                    for id in "${PGS_IDS[@]}"; do
                        extra=()
                        [[ $kind == incr ]] && read -r -a extra <<< "$(pgs_track_args "$id")"
                        log "[$tag] pgstrata backup --type=$kind ${extra[*]} (repository $id)"
                        time_pgstrata_backup "$d/repo-$id" "$codec" "$level" "$tag-$id-$kind" --type="$kind" "${extra[@]}"
                        LABEL[$id,$kind]="$LAST_LABEL"
                        log "[$tag] $id $kind backup: ${LAST_SEC}s, label $LAST_LABEL"
                        if [[ $kind == full ]]; then FT[$id,$codec]=$(min2 "${FT[$id,$codec]:-}" "$LAST_SEC")
                        else IT[$id,$codec]=$(min2 "${IT[$id,$codec]:-}" "$LAST_SEC"); fi
                    done
                else
                    log "[$tag] pgbackrest backup --type=$kind (repo1-bundle=$PGBR_BUNDLE)"
                    time_pgbr_backup "$conf" "$tag-$kind" "$kind"
                    LABEL[pgbackrest,$kind]="$LAST_LABEL"
                    log "[$tag] pgbackrest $kind backup: ${LAST_SEC}s, label $LAST_LABEL"
                    if [[ $kind == full ]]; then FT[pgbackrest,$codec]=$(min2 "${FT[pgbackrest,$codec]:-}" "$LAST_SEC")
                    else IT[pgbackrest,$codec]=$(min2 "${IT[pgbackrest,$codec]:-}" "$LAST_SEC"); fi
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
        for id in "${PGS_IDS[@]}"; do
            pj=$(pgs_info_json "$d/repo-$id" "$tag-$id")
            li="${LABEL[$id,incr]}"; lf="${LABEL[$id,full]}"
            [[ $(pgs_backup_field "$pj" "$li" type) == incr ]] \
                || die "pgstrata backup $li is not an incr: $(pgs_backup_field "$pj" "$li" type)"
            [[ $(pgs_backup_field "$pj" "$li" prior) == "$lf" ]] \
                || die "pgstrata incr $li has prior '$(pgs_backup_field "$pj" "$li" prior)', expected $lf"
            if (( run == 1 )); then
                FS[$id,$codec]=$(pgs_backup_field "$pj" "$lf" stored_size)
                IS[$id,$codec]=$(pgs_backup_field "$pj" "$li" stored_size)
                IREAD[$id,$codec]=$(pgs_backup_field "$pj" "$li" bytes_read)
                IFILES[$id,$codec]="$(pgs_backup_field "$pj" "$li" files_unchanged)/$(pgs_backup_field "$pj" "$li" files)"
                t=$(pgs_backup_field "$pj" "$li" track); why=$(pgs_backup_field "$pj" "$li" track_reason)
                TRK[$id,$codec]="${t:-n/a}${why:+ ($why)}"
                FDU[$id,$codec]=$(du -sb "$d/repo-$id/$STANZA/backup/$lf" | cut -f1)
                IDU[$id,$codec]=$(du -sb "$d/repo-$id/$STANZA/backup/$li" | cut -f1)
                log "[$tag] $id stored: full ${FS[$id,$codec]} (du ${FDU[$id,$codec]}), incr ${IS[$id,$codec]} (du ${IDU[$id,$codec]}), read ${IREAD[$id,$codec]}, unchanged/files ${IFILES[$id,$codec]}, track ${TRK[$id,$codec]}"
            fi
        done
        bj=$(pgbr_info_json "$conf" "$tag")
        [[ $(pgbr_backup_field "$bj" "${LABEL[pgbackrest,incr]}" .type) == incr ]] \
            || die "pgBackRest backup ${LABEL[pgbackrest,incr]} is not an incr"
        if (( run == 1 )); then
            FS[pgbackrest,$codec]=$(pgbr_backup_field "$bj" "${LABEL[pgbackrest,full]}" .info.repository.delta)
            IS[pgbackrest,$codec]=$(pgbr_backup_field "$bj" "${LABEL[pgbackrest,incr]}" .info.repository.delta)
            IREAD[pgbackrest,$codec]=$(pgbr_backup_field "$bj" "${LABEL[pgbackrest,incr]}" .info.delta)
            FDU[pgbackrest,$codec]=$(du -sb "$d/repo-pgbackrest/backup/$STANZA/${LABEL[pgbackrest,full]}" | cut -f1)
            IDU[pgbackrest,$codec]=$(du -sb "$d/repo-pgbackrest/backup/$STANZA/${LABEL[pgbackrest,incr]}" | cut -f1)
            log "[$tag] pgbackrest stored: full ${FS[pgbackrest,$codec]} (du ${FDU[pgbackrest,$codec]}), incr ${IS[pgbackrest,$codec]} (du ${IDU[pgbackrest,$codec]}), database backup size ${IREAD[pgbackrest,$codec]}"
        fi

        if (( VERIFY )) && (( run == 1 )); then
            for id in "${PGS_IDS[@]}"; do
                rdir="$d/restore-$id"; new_restore_dir "$rdir"
                log "[$tag] verify: pgstrata restore --set=${LABEL[$id,incr]} ($id)"
                time_pgstrata_restore "$d/repo-$id" "$rdir" "$tag-$id-verify" --set="${LABEL[$id,incr]}"
                verify_restore "$rdir" "$tag-$id" "after-$tag"
                rm -rf "$rdir"
            done
        fi
    done
    ci=$((ci + 1))
done
clear_archive_targets

# ---------------------------------------------------------------------------------- results
pct2() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f %%", 100 * a / b }'; }
{
    echo "## Incremental backup after a $CHANGE_PCT % change: pgstrata (block-level) vs pgBackRest 2.45 (file-level)"
    echo
    echo "- scenario: pgbench -i -s $SCALE + $COPIES copies test1..test$COPIES of pgbench_accounts; VACUUM ANALYZE + CHECKPOINT; full backup;"
    echo "  DELETE of $CHANGE_PCT % of each copy as one contiguous aid range ($CHUNK rows), VACUUM ANALYSE, CHECKPOINT; incremental backup"
    echo "- database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- process-max $PROCESS_MAX for both tools; each codec at its default level; start-fast; pgBackRest repo1-bundle=$PGBR_BUNDLE"
    echo "- pgstrata incr modes: ${TRACK_LIST[*]} (--track; one pgstrata repository, with its own full, per mode; pgBackRest's numbers are shared)"
    echo "- $(tool_versions)"
    echo "- times: wall clock of the command, best of $RUNS run(s), fresh repositories per run; warm page cache; sync before each timed command"
    echo "- stored MB: what the backup itself wrote (pgstrata: info stored_size; pgBackRest: info backup[].info.repository.delta, \"backup size\")"
    echo "- ratio = pgBackRest / pgstrata (> 1: pgstrata faster or smaller)"
    echo "- machine: $(machine_line)"
    echo
    echo "| codec | full s pgstrata | full s pgBackRest | ratio | full MB pgstrata | full MB pgBackRest | ratio | incr s pgstrata | incr s pgBackRest | ratio | incr MB pgstrata | incr MB pgBackRest | ratio |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for codec in "${CODEC_LIST[@]}"; do
        for id in "${PGS_IDS[@]}"; do
            name="$codec"
            (( ${#PGS_IDS[@]} > 1 )) && name="$codec ($(id_name "$id"))"
            p="$id,$codec"; k="pgbackrest,$codec"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" \
                "${FT[$p]}" "${FT[$k]}" "$(ratio "${FT[$p]}" "${FT[$k]}")" \
                "$(mb "${FS[$p]}")" "$(mb "${FS[$k]}")" "$(ratio "${FS[$p]}" "${FS[$k]}")" \
                "${IT[$p]}" "${IT[$k]}" "$(ratio "${IT[$p]}" "${IT[$k]}")" \
                "$(mb2 "${IS[$p]}")" "$(mb2 "${IS[$k]}")" "$(ratio "${IS[$p]}" "${IS[$k]}")"
        done
    done
    echo
    echo "Incremental backup detail (first run of each codec):"
    echo
    echo "| codec | tool | incr stored / full stored | incr read MB | files unchanged/total | track used | incr dir du MB |"
    echo "|---|---|---:|---:|---:|---|---:|"
    for codec in "${CODEC_LIST[@]}"; do
        for id in "${PGS_IDS[@]}" pgbackrest; do
            p="$id,$codec"
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$codec" "$(id_name "$id")" \
                "$(pct2 "${IS[$p]}" "${FS[$p]}")" "$(mb "${IREAD[$p]}")" "${IFILES[$p]:-n/a}" \
                "${TRK[$p]:-file-level}" "$(mb2 "${IDU[$p]}")"
        done
    done
    echo
    echo "incr read MB: pgstrata bytes_read; pgBackRest \"database backup size\" (bytes of the files it copied again)."
    if (( VERIFY )); then
        echo
        echo "Verified (pgstrata's incr restored, started, WAL replayed, table contents equal to the source after the change): ${VERIFIED[*]}"
    fi
} > "$WORKDIR/results.md"

emit_results "$WORKDIR/results.md"
