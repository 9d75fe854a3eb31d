#!/usr/bin/env bash
# A throwaway PostgreSQL server on this machine, from Debian's package (no container service needed): the server the
# history store's tests (tests/test_history_postgres.py) run against, and a way to try `--store` before a team runs
# its own. It listens on a Unix socket in DIR only, trusts local connections, and holds its data in DIR/data.
#
#   bash ci/postgres.sh start DIR   # prints the connection string: postgresql://syncguard@/syncguard?host=DIR
#   bash ci/postgres.sh stop DIR
#
# As root, the server runs as the package's `postgres` user (initdb refuses root), which must own DIR.
set -euo pipefail
action="${1:-}"
dir="${2:-}"
if [ -z "$dir" ] || { [ "$action" != start ] && [ "$action" != stop ]; }; then
    echo "usage: bash ci/postgres.sh start|stop DIR" >&2
    exit 2
fi
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "ci/postgres.sh: no PostgreSQL server here (Debian: apt-get install postgresql)" >&2
    exit 3
fi
as=()
if [ "$(id -u)" = 0 ]; then
    as=(runuser -u postgres --)
fi
dir="$(realpath -m "$dir")"
if [ "$action" = stop ]; then
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop > /dev/null
    exit 0
fi
mkdir -p "$dir"
if [ "$(id -u)" = 0 ]; then
    chown postgres "$dir"
fi
"${as[@]}" "$bin/initdb" -D "$dir/data" -U syncguard --auth=trust -E UTF8 > "$dir/initdb.log"
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-k $dir -c listen_addresses= -c fsync=off" start > /dev/null
"${as[@]}" "$bin/createdb" -h "$dir" -U syncguard syncguard
echo "postgresql://syncguard@/syncguard?host=$dir"
