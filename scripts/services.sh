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

# Starts the MongoDB test server (mongo-java-server in memory, launched by
# scripts/mongo-server/MongoLauncher.java; built on first use into
# DEPOT_MONGO_BUILD) when nothing listens on its port yet, and exports
# DEPOT_TEST_MONGO. Its data lives in memory: a restart empties it.
DEPOT_MONGO_PORT=${DEPOT_MONGO_PORT:-27018}
DEPOT_MONGO_BUILD=${DEPOT_MONGO_BUILD:-/var/cache/depot/mongo-server}

start_mongo() {
  command -v javac >/dev/null || depot_install_packages openjdk-17-jdk-headless
  command -v mvn >/dev/null || depot_install_packages maven
  local src build port log
  src="$(pwd)/scripts/mongo-server"
  build=$DEPOT_MONGO_BUILD
  port=$DEPOT_MONGO_PORT
  log="$build/server.log"
  if [ ! -f "$build/classes/MongoLauncher.class" ] || [ "$src/MongoLauncher.java" -nt "$build/classes/MongoLauncher.class" ] \
    || [ "$src/pom.xml" -nt "$build/classes/MongoLauncher.class" ]; then
    echo "building the MongoDB test server into $build" >&2
    rm -rf "$build/lib" "$build/classes"
    mkdir -p "$build/classes"
    if ! mvn -q -B -f "$src/pom.xml" dependency:copy-dependencies -DoutputDirectory="$build/lib" >"$build/mvn.log" 2>&1; then
      cat "$build/mvn.log" >&2
      return 1
    fi
    javac -d "$build/classes" -cp "$build/lib/*" "$src/MongoLauncher.java"
  fi
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    nohup java -Xmx4g -cp "$build/classes:$build/lib/*" MongoLauncher "$port" >"$log" 2>&1 &
    echo $! >"$build/server.pid"
    local up=""
    for _ in $(seq 1 100); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
      sleep 0.2
    done
    if [ -z "$up" ]; then
      echo "the MongoDB test server did not start; $log says:" >&2
      cat "$log" >&2
      return 1
    fi
  fi
  export DEPOT_TEST_MONGO="mongodb://127.0.0.1:$port"
  echo "MongoDB test server (mongo-java-server) on port $port" >&2
}
