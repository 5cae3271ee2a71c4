#!/usr/bin/env bash
# bench/incremental.sh: full backup, then an incremental backup after a 1 % change, per codec:
# pgstrata (block-level incremental) vs pgBackRest 2.45 (file-level incremental, and its beta
# block incremental repo1-block=y), side by side.
#
# Usage:
#   bench/incremental.sh [--scale N] [--copies N] [--change-pct P] [--codecs gz,lz4,zst]
#                        [--runs N] [--pgbr file,block] [--pgbr-bundle n|y] [--track LIST]
#                        [--process-max N] [--verify]
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
#   --pgbr LIST        pgBackRest variants, comma-separated, each in its own repository with its
#                      own full backup (default file,block):
#                        file   file-level incremental (repo1-bundle per --pgbr-bundle)
#                        block  block incremental: repo1-bundle=y repo1-block=y beta=y (in 2.45
#                               it needs beta=y; its help says "FOR BETA TESTING ONLY")
#   --pgbr-bundle V    repo1-bundle of the "file" variant: n (pgBackRest default) or y (default n)
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
# pgBackRest's default incremental is file-level: a changed segment file (up to 1 GB) is stored
# again whole. 2.45 also has block incremental (repo1-block, which needs repo1-bundle), marked
# beta in its help; both are measured.
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
PGBR_VARIANTS="file,block"
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
        --pgbr) need_arg "$@"; PGBR_VARIANTS="$2"; shift 2 ;;
        --pgbr=*) PGBR_VARIANTS="${1#*=}"; shift ;;
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
IFS=',' read -r -a PGBR_LIST <<< "$PGBR_VARIANTS"
(( ${#PGBR_LIST[@]} > 0 )) || die "--pgbr is empty"
for v in "${PGBR_LIST[@]}"; do
    case "$v" in file|block) ;; *) die "unknown --pgbr variant '$v' (file, block)" ;; esac
done
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
# Tool ids: pgs-TRACK (one pgstrata repository per --track mode), pgbr-file and pgbr-block (one
# pgBackRest repository per --pgbr variant).
# FT/IT[id,codec] = best full/incr backup s; FS/IS = stored bytes (first run); IREAD = bytes the
# incr read (pgstrata bytes_read; pgBackRest "database backup size", the bytes of the files it
# copied); IFILES = pgstrata files unchanged/total; TRK = pgstrata's track used, every run
declare -A FT IT FS IS IDU FDU IREAD IFILES TRK LABEL
PGS_IDS=()
for tr in "${TRACK_LIST[@]}"; do PGS_IDS+=("pgs-$tr"); done
PGBR_IDS=()
for v in "${PGBR_LIST[@]}"; do PGBR_IDS+=("pgbr-$v"); done
pgs_track_args() { [[ ${1#pgs-} == none ]] || echo "--track=${1#pgs-}"; }
pgbr_bundle_of() { [[ $1 == pgbr-block ]] && echo y || echo "$PGBR_BUNDLE"; }
pgbr_extra_of() { [[ $1 == pgbr-block ]] && printf "repo1-block=y\nbeta=y\n" || true; }
id_name() {
    case "$1" in
        pgbr-file) echo "pgBackRest file-level (repo1-bundle=$PGBR_BUNDLE)" ;;
        pgbr-block) echo "pgBackRest block (repo1-block=y, beta in 2.45)" ;;
        pgs-none) echo "pgstrata" ;;
        *) echo "pgstrata --track=${1#pgs-}" ;;
    esac
}
id_short() {
    case "$1" in
        pgbr-file) echo "pgBackRest file" ;; pgbr-block) echo "pgBackRest block" ;;
        pgs-none) echo "pgstrata" ;; *) echo "pgstrata ${1#pgs-}" ;;
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
        log "[$tag] stanza-create (pgstrata x ${#PGS_IDS[@]}, pgBackRest x ${#PGBR_IDS[@]})"
        pgs_repos=""; pgbr_confs=""
        for id in "${PGS_IDS[@]}"; do
            pgs_stanza_create "$d/repo-$id" "$tag-$id"
            pgs_repos+="$d/repo-$id "
        done
        for id in "${PGBR_IDS[@]}"; do
            write_pgbr_conf "$d/$id.conf" "$d/repo-$id" "$codec" "$level" "$(pgbr_bundle_of "$id")" "$(pgbr_extra_of "$id")"
            pgbr_stanza_create "$d/$id.conf" "$tag-$id"
            pgbr_confs+="$d/$id.conf "
        done
        set_archive_targets "$codec" "$level" "$pgs_repos" "$pgbr_confs"
        if (( ! KEEP )); then
            for old in "$RUNDIR"/*; do [[ "$old" != "$d" ]] && rm -rf "$old"; done
        fi

        order=("${PGS_IDS[@]}" "${PGBR_IDS[@]}")
        if (( (ci + run) % 2 == 0 )); then order=("${PGBR_IDS[@]}" "${PGS_IDS[@]}"); fi

        # Settled state before the full: VACUUM ANALYZE (sets the visibility map everywhere),
        # CHECKPOINT, WAL switched and archived, so no tool's timing includes them.
        psql_src -d postgres -c "VACUUM ANALYZE" || die "VACUUM ANALYZE failed"
        psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
        wal_switch_and_wait

        for kind in full incr; do
            for id in "${order[@]}"; do
                case "$id" in
                    pgs-*)
                        extra=()
                        [[ $kind == incr ]] && read -r -a extra <<< "$(pgs_track_args "$id")"
                        log "[$tag] pgstrata backup --type=$kind ${extra[*]} (repository $id)"
                        time_pgstrata_backup "$d/repo-$id" "$codec" "$level" "$tag-$id-$kind" --type="$kind" "${extra[@]}" ;;
                    pgbr-*)
                        log "[$tag] pgbackrest backup --type=$kind ($(id_name "$id"))"
                        time_pgbr_backup "$d/$id.conf" "$tag-$id-$kind" "$kind" ;;
                esac
                LABEL[$id,$kind]="$LAST_LABEL"
                log "[$tag] $id $kind backup: ${LAST_SEC}s, label $LAST_LABEL"
                if [[ $kind == full ]]; then FT[$id,$codec]=$(min2 "${FT[$id,$codec]:-}" "$LAST_SEC")
                else IT[$id,$codec]=$(min2 "${IT[$id,$codec]:-}" "$LAST_SEC"); fi
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
            t=$(pgs_backup_field "$pj" "$li" track); why=$(pgs_backup_field "$pj" "$li" track_reason)
            rd=$(pgs_backup_field "$pj" "$li" bytes_read)
            # track used and bytes read, for every run (the times are the best of the runs)
            TRK[$id,$codec]+="${TRK[$id,$codec]:+; }r$run: ${t:-n/a}${why:+ ($why)}, read $(mb "$rd") MB"
            if (( run == 1 )); then
                FS[$id,$codec]=$(pgs_backup_field "$pj" "$lf" stored_size)
                IS[$id,$codec]=$(pgs_backup_field "$pj" "$li" stored_size)
                IREAD[$id,$codec]="$rd"
                IFILES[$id,$codec]="$(pgs_backup_field "$pj" "$li" files_unchanged)/$(pgs_backup_field "$pj" "$li" files)"
                FDU[$id,$codec]=$(du -sb "$d/repo-$id/$STANZA/backup/$lf" | cut -f1)
                IDU[$id,$codec]=$(du -sb "$d/repo-$id/$STANZA/backup/$li" | cut -f1)
                log "[$tag] $id stored: full ${FS[$id,$codec]} (du ${FDU[$id,$codec]}), incr ${IS[$id,$codec]} (du ${IDU[$id,$codec]}), unchanged/files ${IFILES[$id,$codec]}"
            fi
            log "[$tag] $id incr: track ${t:-n/a}${why:+ ($why)}, read $rd bytes"
        done
        for id in "${PGBR_IDS[@]}"; do
            bj=$(pgbr_info_json "$d/$id.conf" "$tag-$id")
            li="${LABEL[$id,incr]}"; lf="${LABEL[$id,full]}"
            [[ $(pgbr_backup_field "$bj" "$li" .type) == incr ]] || die "pgBackRest backup $li is not an incr"
            if (( run == 1 )); then
                FS[$id,$codec]=$(pgbr_backup_field "$bj" "$lf" .info.repository.delta)
                IS[$id,$codec]=$(pgbr_backup_field "$bj" "$li" .info.repository.delta)
                IREAD[$id,$codec]=$(pgbr_backup_field "$bj" "$li" .info.delta)
                FDU[$id,$codec]=$(du -sb "$d/repo-$id/backup/$STANZA/$lf" | cut -f1)
                IDU[$id,$codec]=$(du -sb "$d/repo-$id/backup/$STANZA/$li" | cut -f1)
                log "[$tag] $id stored: full ${FS[$id,$codec]} (du ${FDU[$id,$codec]}), incr ${IS[$id,$codec]} (du ${IDU[$id,$codec]}), database backup size ${IREAD[$id,$codec]}"
            fi
        done

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
    echo "## Incremental backup after a $CHANGE_PCT % change: pgstrata (block-level) vs pgBackRest 2.45"
    echo
    echo "- scenario: pgbench -i -s $SCALE + $COPIES copies test1..test$COPIES of pgbench_accounts; VACUUM ANALYZE + CHECKPOINT; full backup;"
    echo "  DELETE of $CHANGE_PCT % of each copy as one contiguous aid range ($CHUNK rows), VACUUM ANALYSE, CHECKPOINT; incremental backup"
    echo "- database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- process-max $PROCESS_MAX for both tools; each codec at its default level; start-fast; one repository (own full) per column group"
    echo "- $(tool_versions)"
    echo "- times: wall clock of the command, best of $RUNS run(s), fresh repositories per run; warm page cache; sync before each timed command"
    echo "- MB: what the backup itself stored (pgstrata: info stored_size; pgBackRest: info backup[].info.repository.delta, \"backup size\")"
    echo "- machine: $(machine_line)"
    echo
    ALL_IDS=("${PGBR_IDS[@]}" "${PGS_IDS[@]}")
    hdr="| codec |"; sep="|---|"
    for id in "${ALL_IDS[@]}"; do
        n=$(id_short "$id")
        hdr+=" $n full s | $n full MB | $n incr s | $n incr MB |"; sep+="---:|---:|---:|---:|"
    done
    echo "$hdr"; echo "$sep"
    for codec in "${CODEC_LIST[@]}"; do
        line="| $codec |"
        for id in "${ALL_IDS[@]}"; do
            p="$id,$codec"
            line+=" ${FT[$p]} | $(mb "${FS[$p]}") | ${IT[$p]} | $(mb2 "${IS[$p]}") |"
        done
        echo "$line"
    done
    echo
    echo "Columns: $(for id in "${ALL_IDS[@]}"; do printf '%s = %s; ' "$(id_short "$id")" "$(id_name "$id")"; done)"
    echo
    echo "Ratios pgBackRest / pgstrata (> 1: pgstrata faster or smaller):"
    echo
    echo "| codec | pgstrata | vs pgBackRest | full time | full size | incr time | incr size |"
    echo "|---|---|---|---:|---:|---:|---:|"
    for codec in "${CODEC_LIST[@]}"; do
        for pid in "${PGS_IDS[@]}"; do
            for bid in "${PGBR_IDS[@]}"; do
                p="$pid,$codec"; k="$bid,$codec"
                printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$codec" "$(id_short "$pid")" "$(id_short "$bid")" \
                    "$(ratio "${FT[$p]}" "${FT[$k]}")" "$(ratio "${FS[$p]}" "${FS[$k]}")" \
                    "$(ratio "${IT[$p]}" "${IT[$k]}")" "$(ratio "${IS[$p]}" "${IS[$k]}")"
            done
        done
    done
    echo
    echo "Incremental backup detail (sizes from the first run of each codec; track used from every run):"
    echo
    echo "| codec | tool | incr stored / full stored | incr read MB | files unchanged/total | incr dir du MB | track used (every run), bytes read |"
    echo "|---|---|---:|---:|---:|---:|---|"
    for codec in "${CODEC_LIST[@]}"; do
        for id in "${ALL_IDS[@]}"; do
            p="$id,$codec"
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$codec" "$(id_name "$id")" \
                "$(pct2 "${IS[$p]}" "${FS[$p]}")" "$(mb "${IREAD[$p]}")" "${IFILES[$p]:-n/a}" \
                "$(mb2 "${IDU[$p]}")" "${TRK[$p]:-n/a}"
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
