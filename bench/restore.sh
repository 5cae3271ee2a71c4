#!/usr/bin/env bash
# bench/restore.sh: full restore and delta restore of an incremental backup taken after a 1 %
# change, pgstrata vs pgBackRest 2.45, side by side.
#
# Usage:
#   bench/restore.sh [--scale N] [--copies N] [--change-pct P] [--codec C] [--runs N]
#                    [--pgbr-bundle n|y|both] [--pgbr-block y|n] [--process-max N] [--verify] [--port N]
#                    [--workdir DIR] [--keep] [--no-build] [--pgstrata BIN] [--out FILE]
#
#   --scale N          pgbench scale factor (default 20; 1 scale = 100,000 rows, ~13 MB heap)
#   --copies N         copies of pgbench_accounts, test1..testN (default 4)
#   --change-pct P     rows deleted from each copy, in percent, as one contiguous aid range
#                      (default 1)
#   --codec C          compression type of every backup, at its default level (default zst)
#   --runs N           repeat every restore N times and keep the best (minimum) time; the
#                      backups are taken once (default 1)
#   --pgbr-bundle V    pgBackRest variants: n (repo1-bundle=n, its default), y, or both
#                      (default both)
#   --pgbr-block y|n   also a pgBackRest variant with block incremental (repo1-bundle=y
#                      repo1-block=y beta=y: 2.45 has the option but refuses it without beta=y;
#                      its help says "FOR BETA TESTING ONLY") (default y)
#   --process-max N    worker count given to both tools, for backup and restore (default 2)
#   --verify           start the cluster that pgstrata's delta restore produced (first run,
#                      bundled repository; WAL replay through pgstrata archive-get) and compare
#                      row counts/sums with the source after the change
#   --port N           port of the throwaway source cluster (default 55432; N+1 for --verify)
#   --workdir DIR      scratch directory (default: mktemp -d under /var/tmp); must not exist
#   --keep             keep the scratch directory (repositories, logs) at the end
#   --no-build         do not run cargo build; use the existing release binary
#   --pgstrata BIN     pgstrata binary to use (implies --no-build)
#   --out FILE         also write the results (markdown) to FILE
#
# What it does (scenario "seed 000", restore part; see bench/README.md):
#   1. builds pgstrata, initdb --data-checksums, starts PostgreSQL 15 with an archive_command that
#      pushes every segment to every repository of both tools;
#   2. pgbench -i -s SCALE, COPIES x CREATE TABLE testI AS SELECT * FROM pgbench_accounts,
#      VACUUM ANALYZE, CHECKPOINT;
#   3. one repository per variant: pgstrata (bundle=true, its default), pgstrata --bundle=false,
#      pgBackRest repo1-bundle=n and/or y, pgBackRest repo1-block=y; a timed full backup in each; then DELETE of
#      CHANGE_PCT % of every copy (one contiguous aid range each), VACUUM ANALYSE, CHECKPOINT;
#      a timed incremental backup in each (pgstrata: block-level; pgBackRest: file-level, or
#      block-level with repo1-block=y);
#   4. per variant (and run):
#      (a) full restore: the incr restored into an empty directory (timed);
#      (b) delta restore: the FULL backup restored into a directory (not timed), then the INCR
#          restored over it with --delta (timed). pgstrata prints the bytes it fetched from the
#          repository; for pgBackRest the files it rewrote are taken from its detail log and their
#          sizes (repo-size: compressed, as fetched; size: as written) from its backup.manifest;
#      (c) the directory of (b) is compared file by file (diff -r) with the one of (a): a delta
#          restore must give exactly the same files as a full restore of the same backup;
#   5. prints markdown tables with ratios.
#
# Requirements: run as root; PostgreSQL 15 in /usr/lib/postgresql/15/bin (or PG_BIN=...);
# pgbench; pgbackrest; jq; cargo (unless --no-build). Helpers: bench/lib.sh.

set -Eeuo pipefail

BENCH_NAME=restore.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------------------------- options
bench_defaults
SCALE=20
COPIES=4
CHANGE_PCT=1
CODEC=zst
RUNS=1
PGBR_BUNDLE=both
PGBR_BLOCK=y
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
        --codec) need_arg "$@"; CODEC="$2"; shift 2 ;;
        --codec=*) CODEC="${1#*=}"; shift ;;
        --runs) need_arg "$@"; RUNS="$2"; shift 2 ;;
        --runs=*) RUNS="${1#*=}"; shift ;;
        --pgbr-bundle) need_arg "$@"; PGBR_BUNDLE="$2"; shift 2 ;;
        --pgbr-bundle=*) PGBR_BUNDLE="${1#*=}"; shift ;;
        --pgbr-block) need_arg "$@"; PGBR_BLOCK="$2"; shift 2 ;;
        --pgbr-block=*) PGBR_BLOCK="${1#*=}"; shift ;;
        --verify) VERIFY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

is_uint "$SCALE" && (( SCALE >= 1 )) || die "--scale must be a positive integer, got '$SCALE'"
is_uint "$COPIES" && (( COPIES >= 1 )) || die "--copies must be >= 1, got '$COPIES'"
is_uint "$CHANGE_PCT" && (( CHANGE_PCT >= 1 && CHANGE_PCT <= 10 )) || die "--change-pct must be an integer 1..10, got '$CHANGE_PCT'"
is_uint "$RUNS" && (( RUNS >= 1 )) || die "--runs must be >= 1, got '$RUNS'"
LEVEL=$(default_level "$CODEC") || die "unknown codec '$CODEC' (zst, lz4, gz, bz2, none)"
check_common_options
VARIANTS=(pgs-b1 pgs-b0)
case "$PGBR_BUNDLE" in n) VARIANTS+=(pgbr-bn) ;; y) VARIANTS+=(pgbr-by) ;; both) VARIANTS+=(pgbr-bn pgbr-by) ;;
    *) die "--pgbr-bundle must be n, y or both, got '$PGBR_BUNDLE'" ;; esac
case "$PGBR_BLOCK" in y) VARIANTS+=(pgbr-bk) ;; n) ;; *) die "--pgbr-block must be y or n, got '$PGBR_BLOCK'" ;; esac
declare -A VNAME=([pgs-b1]="pgstrata (bundle=true)" [pgs-b0]="pgstrata (--bundle=false)"
    [pgbr-bn]="pgBackRest (repo1-bundle=n)" [pgbr-by]="pgBackRest (repo1-bundle=y)"
    [pgbr-bk]="pgBackRest (repo1-block=y, bundle=y)")
has_variant() { local v; for v in "${VARIANTS[@]}"; do [[ $v == "$1" ]] && return 0; done; return 1; }

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

# ------------------------------------------------------------------------------ repositories
declare -A REPO CONF
pgs_repos=""; pgbr_confs=""
for v in "${VARIANTS[@]}"; do
    case "$v" in
        pgs-*)
            REPO[$v]="$RUNDIR/repo-$v"
            pgs_stanza_create "${REPO[$v]}" "$v"
            pgs_repos+="${REPO[$v]} " ;;
        pgbr-b*)
            REPO[$v]="$RUNDIR/repo-$v"
            CONF[$v]="$RUNDIR/$v.conf"
            if [[ $v == pgbr-bk ]]; then
                write_pgbr_conf "${CONF[$v]}" "${REPO[$v]}" "$CODEC" "$LEVEL" y "$(printf "repo1-block=y\nbeta=y")"
            else
                write_pgbr_conf "${CONF[$v]}" "${REPO[$v]}" "$CODEC" "$LEVEL" "${v#pgbr-b}"
            fi
            pgbr_stanza_create "${CONF[$v]}" "$v"
            pgbr_confs+="${CONF[$v]} " ;;
    esac
done
set_archive_targets "$CODEC" "$LEVEL" "$pgs_repos" "$pgbr_confs"
psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
wal_switch_and_wait

# ------------------------------------------------------------------------------- backups
declare -A BT LABEL ISIZE
backup_variant() {   # variant kind
    local v="$1" kind="$2" extra=()
    case "$v" in
        pgs-*)
            [[ $v == pgs-b0 ]] && extra=(--bundle=false)
            log "${VNAME[$v]}: $kind backup"
            time_pgstrata_backup "${REPO[$v]}" "$CODEC" "$LEVEL" "$v-$kind" --type="$kind" "${extra[@]}" ;;
        pgbr-*)
            log "${VNAME[$v]}: $kind backup"
            time_pgbr_backup "${CONF[$v]}" "$v-$kind" "$kind" ;;
    esac
    BT[$v,$kind]="$LAST_SEC"; LABEL[$v,$kind]="$LAST_LABEL"
    log "${VNAME[$v]}: $kind backup ${LAST_SEC}s, label $LAST_LABEL"
}

for v in "${VARIANTS[@]}"; do backup_variant "$v" full; done

sql=""
for ((i = 1; i <= COPIES; i++)); do
    frac=$(( (5 + 13 * (i - 1)) % (100 - CHANGE_PCT) ))
    a=$(( ROWS * frac / 100 + 1 ))
    sql+="DELETE FROM test$i WHERE aid BETWEEN $a AND $((a + CHUNK - 1)); "
done
log "change: $sql"
psql_src -d postgres -c "$sql" >"$LOGDIR/change.out" || die "DELETE failed"
psql_src -d postgres -c "VACUUM ANALYSE" || die "VACUUM ANALYSE failed"
record_source_check after-change
psql_src -d postgres -c "CHECKPOINT" || die "CHECKPOINT failed"
wal_switch_and_wait

# Reverse order for the incrementals, so no variant always goes first.
for ((j = ${#VARIANTS[@]} - 1; j >= 0; j--)); do backup_variant "${VARIANTS[j]}" incr; done

for v in "${VARIANTS[@]}"; do
    case "$v" in
        pgs-*)
            ISIZE[$v]=$(pgs_info_json "${REPO[$v]}" "$v" | "$JQ" -r --arg l "${LABEL[$v,incr]}" \
                '(.backups // .[0].backups)[] | select(.label == $l) | .stored_size')
            t=$(pgs_info_json "${REPO[$v]}" "$v" | "$JQ" -r --arg l "${LABEL[$v,incr]}" \
                '(.backups // .[0].backups)[] | select(.label == $l) | .type') ;;
        pgbr-*)
            ISIZE[$v]=$(pgbr_info_json "${CONF[$v]}" "$v" | "$JQ" -r --arg l "${LABEL[$v,incr]}" \
                '.[0].backup[] | select(.label == $l) | .info.repository.delta')
            t=$(pgbr_info_json "${CONF[$v]}" "$v" | "$JQ" -r --arg l "${LABEL[$v,incr]}" \
                '.[0].backup[] | select(.label == $l) | .type') ;;
    esac
    [[ $t == incr ]] || die "${VNAME[$v]}: backup ${LABEL[$v,incr]} is '$t', not incr"
    log "${VNAME[$v]}: incr stored ${ISIZE[$v]} bytes"
done
clear_archive_targets   # restores do not need the archive command any more

# ------------------------------------------------------------------------------- restores
# pgBackRest's delta restore: files it rewrote (from its detail log) and their sizes (from the
# incr's backup.manifest). Prints "files repo_bytes bytes".
pgbr_delta_fetched() {   # variant restore-dir log-file
    local manifest="${REPO[$1]}/backup/$STANZA/${LABEL[$1,incr]}/backup.manifest"
    awk -v dir="$2/" '
        FNR == NR {
            if ($0 ~ /^\[/) { sect = $0; next }
            if (sect == "[target:file]") {
                k = substr($0, 1, index($0, "=") - 1)
                s = $0; sub(/.*"size":/, "", s); sub(/[,}].*/, "", s)
                r = $0; if (r ~ /"repo-size":/) { sub(/.*"repo-size":/, "", r); sub(/[,}].*/, "", r) } else r = 0
                size[k] = s; rsize[k] = r
            }
            next
        }
        / DETAIL: restore file / && !/ - exists and / {
            p = $0; sub(/.* DETAIL: restore file /, "", p); sub(/ \(.*/, "", p)
            sub(/\.pgbackrest\.tmp$/, "", p)
            if (index(p, dir) == 1) p = substr(p, length(dir) + 1)
            k = "pg_data/" p
            if (!(k in size)) { missing++; next }
            n++; rb += rsize[k]; b += size[k]
        }
        END { printf "%d %d %d %d\n", n, rb, b, missing }
    ' "$manifest" "$3"
}

declare -A RF RD RP FETCH WROTE NFILES SAME PGS_STATS
for ((run = 1; run <= RUNS; run++)); do
    order=("${VARIANTS[@]}")
    if (( run % 2 == 0 )); then
        order=(); for ((j = ${#VARIANTS[@]} - 1; j >= 0; j--)); do order+=("${VARIANTS[j]}"); done
    fi
    for v in "${order[@]}"; do
        tag="$v-r$run"
        full_dir="$RUNDIR/restore-full-$v"     # (a) the incr into an empty directory
        delta_dir="$RUNDIR/restore-delta-$v"   # (b) the full, then the incr over it with --delta
        new_restore_dir "$full_dir"; new_restore_dir "$delta_dir"
        case "$v" in
            pgs-*)
                log "[$tag] pgstrata restore --set=${LABEL[$v,incr]} (empty directory)"
                time_pgstrata_restore "${REPO[$v]}" "$full_dir" "$tag-full" --set="${LABEL[$v,incr]}"
                RF[$v]=$(min2 "${RF[$v]:-}" "$LAST_SEC"); log "[$tag] full restore ${LAST_SEC}s"
                log "[$tag] pgstrata restore --set=${LABEL[$v,full]} (preparing the delta restore)"
                time_pgstrata_restore "${REPO[$v]}" "$delta_dir" "$tag-prep" --set="${LABEL[$v,full]}"
                RP[$v]=$(min2 "${RP[$v]:-}" "$LAST_SEC")
                log "[$tag] pgstrata restore --delta --set=${LABEL[$v,incr]}"
                time_pgstrata_restore "${REPO[$v]}" "$delta_dir" "$tag-delta" --delta --set="${LABEL[$v,incr]}"
                RD[$v]=$(min2 "${RD[$v]:-}" "$LAST_SEC")
                line=$(grep '^restored backup' "$LOGDIR/pgstrata-restore-$tag-delta.out" || true)
                [[ -n "$line" ]] || die "pgstrata restore --delta printed no summary ($LOGDIR/pgstrata-restore-$tag-delta.out)"
                FETCH[$v]=$(sed -n 's/.*; \([0-9]*\) bytes fetched.*/\1/p' <<< "$line")
                PGS_STATS[$v]=$(sed -n 's/^restored backup [^:]*: \(.*\);.*/\1/p' <<< "$line")
                log "[$tag] delta restore ${LAST_SEC}s: $line" ;;
            pgbr-*)
                log "[$tag] pgbackrest restore --set=${LABEL[$v,incr]} (empty directory)"
                time_pgbr_restore "${CONF[$v]}" "$full_dir" "$tag-full" --set="${LABEL[$v,incr]}"
                RF[$v]=$(min2 "${RF[$v]:-}" "$LAST_SEC"); log "[$tag] full restore ${LAST_SEC}s"
                log "[$tag] pgbackrest restore --set=${LABEL[$v,full]} (preparing the delta restore)"
                time_pgbr_restore "${CONF[$v]}" "$delta_dir" "$tag-prep" --set="${LABEL[$v,full]}"
                RP[$v]=$(min2 "${RP[$v]:-}" "$LAST_SEC")
                log "[$tag] pgbackrest restore --delta --set=${LABEL[$v,incr]}"
                time_pgbr_restore "${CONF[$v]}" "$delta_dir" "$tag-delta" --delta --set="${LABEL[$v,incr]}" \
                    --log-level-console=detail
                RD[$v]=$(min2 "${RD[$v]:-}" "$LAST_SEC")
                read -r nf rb b missing < <(pgbr_delta_fetched "$v" "$delta_dir" "$LOGDIR/pgbackrest-restore-$tag-delta.out")
                FETCH[$v]="$rb"; WROTE[$v]="$b"; NFILES[$v]="$nf"
                (( missing == 0 )) || log "warning: $missing restored files not found in the manifest"
                log "[$tag] delta restore ${LAST_SEC}s: $nf files rewritten, $rb repo bytes, $b bytes" ;;
        esac
        # (c) a delta restore must produce the same files as a full restore of the same backup.
        # postgresql.auto.conf is compared without the recovery settings: pgBackRest writes the
        # restore time and the restore directory (--pg1-path) into them.
        if diff -r --no-dereference --exclude=postgresql.auto.conf "$full_dir" "$delta_dir" > "$LOGDIR/diff-$tag.txt" 2>&1 \
            && diff <(grep -Ev '^# Recovery settings generated|^restore_command' "$full_dir/postgresql.auto.conf") \
                    <(grep -Ev '^# Recovery settings generated|^restore_command' "$delta_dir/postgresql.auto.conf") \
                    >> "$LOGDIR/diff-$tag.txt" 2>&1; then
            SAME[$v]="${SAME[$v]:-yes}"
        else
            SAME[$v]=NO
            log "ERROR: ${VNAME[$v]}: the delta restore differs from the full restore of ${LABEL[$v,incr]}:"
            head -n 20 "$LOGDIR/diff-$tag.txt" >&2
        fi
        if (( VERIFY )) && (( run == 1 )) && [[ $v == pgs-b1 ]]; then
            verify_restore "$delta_dir" "$tag-delta" after-change
        fi
        rm -rf "$full_dir" "$delta_dir"
    done
done

# ---------------------------------------------------------------------------------- results
r1() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
{
    echo "## Restore after a $CHANGE_PCT % change: full restore vs delta restore, pgstrata vs pgBackRest 2.45"
    echo
    echo "- scenario: pgbench -i -s $SCALE + $COPIES copies test1..test$COPIES of pgbench_accounts; VACUUM ANALYZE, CHECKPOINT; full backup;"
    echo "  DELETE of $CHANGE_PCT % of each copy as one contiguous aid range ($CHUNK rows), VACUUM ANALYSE, CHECKPOINT; incr backup"
    echo "- database size: $(mb "$DB_BYTES") MB (sum of pg_database_size); data directory without pg_wal: $(mb "$DATADIR_BYTES") MB"
    echo "- codec $CODEC level $LEVEL; process-max $PROCESS_MAX for both tools, backup and restore; local repositories"
    echo "- $(tool_versions)"
    echo "- backups timed once; restores: best of $RUNS run(s); warm page cache; sync before each timed command"
    echo "- full restore: the incr restored into an empty directory. delta restore: the full restored first (not timed), then the incr"
    echo "  restored over it with --delta. Both tools hash every local file/block; both fsync what they write"
    echo "- delta fetched: pgstrata's \"N bytes fetched\" (measured); pgBackRest: repo-size (compressed) in the incr's manifest of the files its"
    echo "  detail log says it rewrote (derived, not measured; with repo1-block=y that is the incr's own block data for those files)"
    echo "- pgBackRest incrementals are file-level, except with repo1-block=y (block incremental, beta in 2.45); pgstrata's are block-level"
    echo "- machine: $(machine_line)"
    echo
    echo "| variant | full backup s | incr backup s | incr stored MB | full restore s | delta restore s | full / delta | delta fetched MB | delta = full restore |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    for v in "${VARIANTS[@]}"; do
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "${VNAME[$v]}" \
            "${BT[$v,full]}" "${BT[$v,incr]}" "$(mb2 "${ISIZE[$v]}")" \
            "${RF[$v]}" "${RD[$v]}" "$(r1 "${RF[$v]}" "${RD[$v]}")" "$(mb2 "${FETCH[$v]}")" "${SAME[$v]}"
    done
    echo
    echo "pgstrata vs pgBackRest (ratio = pgBackRest / pgstrata; > 1: pgstrata faster or smaller):"
    echo
    echo "| pair | full backup | incr backup | incr stored | full restore | delta restore | delta fetched |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    pair() {   # pgstrata-variant pgbr-variant title
        has_variant "$1" && has_variant "$2" || return 0
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$3" \
            "$(ratio "${BT[$1,full]}" "${BT[$2,full]}")" "$(ratio "${BT[$1,incr]}" "${BT[$2,incr]}")" \
            "$(ratio "${ISIZE[$1]}" "${ISIZE[$2]}")" "$(ratio "${RF[$1]}" "${RF[$2]}")" \
            "$(ratio "${RD[$1]}" "${RD[$2]}")" "$(ratio "${FETCH[$1]}" "${FETCH[$2]}")"
    }
    pair pgs-b1 pgbr-bn "each tool's default: pgstrata bundle=true vs pgBackRest repo1-bundle=n"
    pair pgs-b1 pgbr-by "bundling on: pgstrata bundle=true vs pgBackRest repo1-bundle=y"
    pair pgs-b0 pgbr-bn "bundling off: pgstrata --bundle=false vs pgBackRest repo1-bundle=n"
    pair pgs-b1 pgbr-bk "block incremental: pgstrata bundle=true vs pgBackRest repo1-block=y"
    echo
    echo "Delta restore detail (last run):"
    echo
    for v in "${VARIANTS[@]}"; do
        case "$v" in
            pgs-*) echo "- ${VNAME[$v]}: ${PGS_STATS[$v]}; ${FETCH[$v]} bytes fetched" ;;
            pgbr-*) echo "- ${VNAME[$v]}: ${NFILES[$v]} files rewritten, ${FETCH[$v]} bytes fetched (repo-size), ${WROTE[$v]} bytes written" ;;
        esac
    done
    echo "- restore of the full backup before each delta restore (not part of the delta time): $(for v in "${VARIANTS[@]}"; do printf '%s %ss; ' "${VNAME[$v]}" "${RP[$v]}"; done)"
    if (( VERIFY )); then
        echo
        echo "Verified (pgstrata's delta-restored cluster started, WAL replayed, table contents equal to the source after the change): ${VERIFIED[*]}"
    fi
} > "$WORKDIR/results.md"

emit_results "$WORKDIR/results.md"
for v in "${VARIANTS[@]}"; do
    [[ ${SAME[$v]} == yes ]] || die "${VNAME[$v]}: delta restore and full restore of the same backup differ (see $LOGDIR/diff-*.txt)"
done
