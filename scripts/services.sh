# Real services for the tests. Sourced by scripts/test.sh after deps.sh.

# Starts PostgreSQL (installing it when missing) and exports
# DEPOT_TEST_POSTGRES, the URL of a database the tests may use to create
# their own databases.
start_postgres() {
  depot_install_packages postgresql
  local version port
  version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$version main" || pg_createcluster "$version" main >/dev/null
  pg_lsclusters -h | grep -q "^$version main .* online" || pg_ctlcluster "$version" main start
  port=$(pg_lsclusters -h | awk -v v="$version" '$1==v && $2=="main" {print $3}')
  for _ in $(seq 1 50); do
    pg_isready -q -h 127.0.0.1 -p "$port" && break
    sleep 0.2
  done
  runuser -u postgres -- psql -p "$port" -qtAc "SELECT 1 FROM pg_roles WHERE rolname = 'depot'" | grep -q 1 \
    || runuser -u postgres -- psql -p "$port" -qc "CREATE ROLE depot LOGIN CREATEDB PASSWORD 'depot'"
  runuser -u postgres -- psql -p "$port" -qtAc "SELECT 1 FROM pg_database WHERE datname = 'depot'" | grep -q 1 \
    || runuser -u postgres -- createdb -p "$port" -O depot depot
  # Databases earlier test runs created for themselves.
  runuser -u postgres -- psql -p "$port" -qtAc "SELECT datname FROM pg_database WHERE datname LIKE 'depot\_t\_%'" \
    | while read -r db; do runuser -u postgres -- dropdb -p "$port" --if-exists "$db"; done
  export DEPOT_TEST_POSTGRES="postgres://depot:depot@127.0.0.1:$port/depot"
  export DEPOT_TEST_POSTGRES_CLUSTER="$version main"
  echo "PostgreSQL $version on port $port" >&2
}
