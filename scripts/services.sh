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
# DEPOT_TEST_MONGO. Its data lives in memory: a restart empties it. Also
# exports DEPOT_MONGO_BUILD, from which tests launch private servers
# (`java -cp "$DEPOT_MONGO_BUILD/classes:$DEPOT_MONGO_BUILD/lib/*"
# MongoLauncher PORT [FILE]`; with a FILE the data survives a restart).
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
    nohup java -Xmx12g -cp "$build/classes:$build/lib/*" MongoLauncher "$port" >"$log" 2>&1 &
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
  export DEPOT_MONGO_BUILD
  echo "MongoDB test server (mongo-java-server) on port $port" >&2
}

# Starts S3Proxy (https://github.com/gaul/s3proxy) over a local directory, a
# real S3 API for the s3 engine's tests, and exports DEPOT_TEST_S3 (its
# endpoint), DEPOT_TEST_S3_ACCESS_KEY and DEPOT_TEST_S3_SECRET_KEY. The jar
# is fetched from Maven Central once and kept outside the repository;
# DEPOT_S3PROXY_JAR says where, for tests that run private instances.
S3PROXY_VERSION=2.6.0
S3PROXY_PORT=9100
S3PROXY_HOME=/var/cache/depot/s3proxy
S3PROXY_DATA=/var/lib/depot-s3proxy
start_s3() {
  command -v java >/dev/null || depot_install_packages default-jre-headless
  command -v mvn >/dev/null || depot_install_packages maven
  local jar="$S3PROXY_HOME/s3proxy-$S3PROXY_VERSION-jar-with-dependencies.jar"
  local endpoint="http://127.0.0.1:$S3PROXY_PORT"
  local access_key=depot secret_key=depot-test-secret
  mkdir -p "$S3PROXY_HOME" "$S3PROXY_DATA"
  if [ ! -f "$jar" ]; then
    echo "fetching s3proxy $S3PROXY_VERSION" >&2
    mvn -B -q dependency:copy -Dartifact="org.gaul:s3proxy:$S3PROXY_VERSION:jar:jar-with-dependencies" \
      -DoutputDirectory="$S3PROXY_HOME" >&2
  fi
  cat >"$S3PROXY_HOME/s3proxy.properties" <<PROPERTIES
s3proxy.endpoint=$endpoint
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$access_key
s3proxy.credential=$secret_key
jclouds.provider=filesystem
jclouds.filesystem.basedir=$S3PROXY_DATA
PROPERTIES
  # Buckets earlier test runs created for themselves.
  find "$S3PROXY_DATA" -mindepth 1 -maxdepth 1 -name 'depot-t-*' -exec rm -rf {} +
  if ! s3_answers "$S3PROXY_PORT"; then
    setsid java -jar "$jar" --properties "$S3PROXY_HOME/s3proxy.properties" \
      >>"$S3PROXY_HOME/s3proxy.log" 2>&1 </dev/null &
    for _ in $(seq 1 150); do
      s3_answers "$S3PROXY_PORT" && break
      sleep 0.2
    done
    s3_answers "$S3PROXY_PORT" || { tail -n 20 "$S3PROXY_HOME/s3proxy.log" >&2; echo "s3proxy did not start" >&2; return 1; }
  fi
  export DEPOT_TEST_S3="$endpoint"
  export DEPOT_TEST_S3_ACCESS_KEY="$access_key"
  export DEPOT_TEST_S3_SECRET_KEY="$secret_key"
  export DEPOT_S3PROXY_JAR="$jar"
  echo "s3proxy $S3PROXY_VERSION on port $S3PROXY_PORT (log $S3PROXY_HOME/s3proxy.log)" >&2
}

# Whether an HTTP server answers on 127.0.0.1:PORT (any status will do).
s3_answers() (
  exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
  printf 'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
  [[ "$(head -c 12 <&3)" == HTTP/1.* ]]
) 2>/dev/null
