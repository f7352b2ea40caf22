#!/usr/bin/env bash
# A throwaway PostgreSQL for the `tidelog-bench trx-status` baseline (the bench runs this
# script with bash; it can also be run by hand).
#
#   pg-baseline.sh start XIDS ABORT_EVERY   → prints key=value lines (dir=, socket_dir=, port=,
#                                             first_xid=, last_xid=, aborted_file=, build_s=,
#                                             version=); the cluster keeps running
#   pg-baseline.sh stop DIR                 → stops the cluster in DIR and removes DIR
#
# start: finds initdb/pg_ctl under /usr/lib/postgresql/*/bin (installs Debian's
# `postgresql` with apt-get if missing), initdb's a fresh cluster in a new /tmp directory as
# the `postgres` system user (PostgreSQL refuses to run as root), trust auth, Unix socket
# only (listen_addresses=''), fsync/synchronous_commit/full_page_writes off (a throwaway:
# only the xid status look-ups are timed, not the build) and autovacuum off (no background
# xid or clog activity during the look-ups). Then one procedure assigns XIDS transaction ids
# in a loop, committing each, except every ABORT_EVERY-th, which it rolls back; the aborted
# xids are written one per line to aborted_file. Exit status ≠ 0 with a message on stderr
# when anything fails (the cluster is then stopped and removed).
set -euo pipefail

die() {
    echo "pg-baseline.sh: $*" >&2
    exit 1
}

find_bin() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/psql" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

# Runs a command as the postgres user when we are root, as ourselves otherwise.
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

stop_cluster() {
    local dir=$1
    [ -n "$dir" ] && [ -d "$dir" ] || return 0
    case "$dir" in
    /tmp/tidelog-pg.*) ;;
    *) die "refusing to remove $dir: not a directory this script created" ;;
    esac
    local bin
    bin=$(find_bin) || true
    if [ -n "$bin" ] && [ -f "$dir/data/postmaster.pid" ]; then
        as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf -- "$dir"
}

start_cluster() {
    local xids=$1 abort_every=$2
    [[ "$xids" =~ ^[0-9]+$ ]] || die "XIDS must be a number, got '$xids'"
    [[ "$abort_every" =~ ^[0-9]+$ ]] || die "ABORT_EVERY must be a number, got '$abort_every'"
    local bin
    if ! bin=$(find_bin); then
        [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and we are not root to apt-get it"
        command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is not available"
        echo "pg-baseline.sh: installing postgresql with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends postgresql >&2 \
            || { apt-get update >&2 && apt-get install -y --no-install-recommends postgresql >&2; } \
            || die "apt-get install postgresql failed"
        bin=$(find_bin) || die "postgresql installed, but no initdb/pg_ctl under /usr/lib/postgresql/*/bin"
    fi
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || die "running as root but there is no postgres user to run the server as"
    fi
    # Global, not local: the EXIT trap runs after this function has returned.
    PG_DIR=$(mktemp -d /tmp/tidelog-pg.XXXXXX)
    local dir=$PG_DIR
    # Any failure from here on (set -e, or die's exit) stops and removes the cluster.
    trap 'stop_cluster "$PG_DIR"' EXIT
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
    fi
    chmod 700 "$dir"
    as_pg "$bin/initdb" -D "$dir/data" --auth=trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || die "initdb failed; see $dir/initdb.log"
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-k $dir -c listen_addresses='' -c port=5432 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off" \
        start >/dev/null || die "pg_ctl start failed; see $dir/server.log"
    local psql=("$bin/psql" -h "$dir" -p 5432 -U postgres -d postgres -X -q -v ON_ERROR_STOP=1 -At)
    as_pg "${psql[@]}" -c "
        CREATE TABLE aborted_xids (x xid8);
        CREATE PROCEDURE make_xids(n bigint, abort_every bigint) LANGUAGE plpgsql AS \$\$
        DECLARE
            aborted xid8[] := '{}';
            x xid8;
        BEGIN
            FOR i IN 1..n LOOP
                x := pg_current_xact_id();
                IF abort_every > 0 AND i % abort_every = 0 THEN
                    aborted := aborted || x;
                    ROLLBACK;
                ELSE
                    COMMIT;
                END IF;
            END LOOP;
            INSERT INTO aborted_xids SELECT unnest(aborted);
            COMMIT;
        END \$\$;" >/dev/null
    local first last t0 t1
    first=$(as_pg "${psql[@]}" -c "SELECT pg_current_xact_id()")
    t0=$(date +%s.%N)
    as_pg "${psql[@]}" -c "CALL make_xids($xids, $abort_every)" >/dev/null
    t1=$(date +%s.%N)
    last=$(as_pg "${psql[@]}" -c "SELECT pg_current_xact_id()")
    as_pg "${psql[@]}" -c "CHECKPOINT" >/dev/null
    as_pg "${psql[@]}" -c "COPY aborted_xids TO STDOUT" >"$dir/aborted.txt"
    echo "dir=$dir"
    echo "socket_dir=$dir"
    echo "port=5432"
    echo "first_xid=$first"
    echo "last_xid=$last"
    echo "aborted_file=$dir/aborted.txt"
    echo "build_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
    local version
    version=$(as_pg "${psql[@]}" -c "SHOW server_version")
    trap - EXIT
    echo "version=$version"
}

case "${1:-}" in
start)
    [ $# = 3 ] || die "usage: $0 start XIDS ABORT_EVERY"
    start_cluster "$2" "$3"
    ;;
stop)
    [ $# = 2 ] || die "usage: $0 stop DIR"
    stop_cluster "$2"
    ;;
*)
    die "usage: $0 start XIDS ABORT_EVERY | stop DIR"
    ;;
esac
