#!/usr/bin/env bash
# Tests of what operators install: the Debian package (lintian, contents, the unpacked binary
# and unit, a real install, upgrade, removal and purge), its man pages and shell completions,
# and the Prometheus alert rules (promtool). Run by scripts/test.sh after the cargo tests;
# alone: scripts/test-package.sh [--profile PROFILE] (default: dev, see docs/packaging.md).
# Needs root (apt installs of missing tools, dpkg -i); refuses clearly otherwise.
# Prints one line per check and ends with "package tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

profile=dev
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=${2:?--profile needs a value}; shift 2 ;;
    *) echo "usage: scripts/test-package.sh [--profile PROFILE]" >&2; exit 2 ;;
  esac
done

. scripts/pg.sh

# A TCP port nothing listens on (loopback).
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

passed=0
failed=0
failures=()
# check NAME COMMAND...: runs one check in a subshell with `set -e` (any failing command
# fails the check), its output indented; counts it.
check() {
  local name=$1; shift
  echo "--- $name"
  (set -e; "$@") 2>&1 | sed 's/^/    /'
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    failed=$((failed + 1))
    failures+=("$name")
  fi
}
finish() {
  echo
  for f in "${failures[@]}"; do echo "failed: $f"; done
  echo "package tests: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test-package.sh must run as root: it installs the tools it needs with apt and" >&2
  echo "installs and purges the package with dpkg (run it in a throwaway VM or container)." >&2
  failed=1; failures+=("running as root"); finish
fi

# The tools, and the Debian packages that bring them: missing ones are installed in one go.
tools="lintian:lintian promtool:prometheus man:man-db groff:groff-base systemd-analyze:systemd
  dpkg-shlibdeps:dpkg-dev zsh:zsh fish:fish git:git openssl:openssl setpriv:util-linux"
missing=""
for t in $tools; do
  command -v "${t%%:*}" >/dev/null 2>&1 || missing+=" ${t#*:}"
done
if [ -n "$missing" ]; then
  echo "installing$missing (apt-get install -y --no-install-recommends$missing)…"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
for t in $tools; do
  if ! command -v "${t%%:*}" >/dev/null 2>&1; then
    echo "${t%%:*} missing: install the Debian package ${t#*:}" >&2
    failed=$((failed + 1)); failures+=("${t%%:*} installed")
  fi
done
# The postinst check runs a throwaway PostgreSQL (scripts/pg.sh installs it when missing).
pg_ensure_installed || { failed=$((failed + 1)); failures+=("PostgreSQL server binaries installed"); }
[ "$failed" -eq 0 ] || finish

work=$(mktemp -d)
user_existed=$(getent passwd qlsched >/dev/null && echo yes || echo no)
cleanup() {
  dpkg --purge qlsched >/dev/null 2>&1 || true
  if dpkg-divert --list /bin/systemd-sysusers | grep -q qlsched-test; then
    dpkg-divert --quiet --local --rename --remove /bin/systemd-sysusers
  fi
  if [ "$user_existed" = no ] && getent passwd qlsched >/dev/null; then userdel qlsched; fi
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- build
build() {
  local start=$SECONDS
  scripts/package.sh --profile "$profile" >"$work/deb-path" || return 1
  echo "built $(tail -n1 "$work/deb-path") (profile $profile) in $((SECONDS - start)) s"
}
check "scripts/package.sh builds the .deb" build
deb=$(tail -n1 "$work/deb-path" 2>/dev/null)
[ -f "${deb:-}" ] || finish

# ---------------------------------------------------------------- static checks of the .deb
lintian_clean() {
  local out tag status=0
  lintian --pedantic --fail-on error "$deb" >"$work/lintian" 2>&1 || status=$?
  out=$(grep -v '^running with root privileges' "$work/lintian" || true)
  echo "${out:-(no tags)}"
  [ "$status" -eq 0 ] || { echo "lintian reports errors (exit $status)"; return 1; }
  # Every warning left must be explained in docs/packaging.md.
  for tag in $(echo "$out" | sed -n 's/^[WIP]: qlsched[^:]*: \([a-z0-9-]*\).*/\1/p' | sort -u); do
    grep -q -- "\`$tag\`" docs/packaging.md || { echo "lintian tag $tag is not explained in docs/packaging.md"; return 1; }
  done
}
check "lintian: no errors, every warning explained in docs/packaging.md" lintian_clean

contents_match() {
  dpkg-deb -c "$deb" | awk '{print $1, $2, $6}' | sort >"$work/contents"
  diff -u debian/contents.expected "$work/contents" || {
    echo "the .deb's contents differ from debian/contents.expected (- expected, + built)"
    return 1
  }
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles >"$work/conffiles"
  diff -u <(echo /etc/qlsched/replica.toml.example) "$work/conffiles"
}
check ".deb contents equal debian/contents.expected; the example is a conffile" contents_match

root=$work/root
dpkg-deb -x "$deb" "$root"

version_names_commit() {
  local want got commit
  commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  want="qlsched $(dpkg-deb -f "$deb" Version | sed 's/-[^-]*$//') (commit $commit)"
  got=$("$root/usr/bin/qlsched" --version) || return 1
  echo "$got"
  [ "$got" = "$want" ] || { echo "expected: $want"; return 1; }
}
check "the unpacked binary answers --version with the version and the git commit" version_names_commit

# The example connects with sslmode=verify-full and a root certificate under /etc/qlsched
# (read at check time): a throwaway CA stands in for it.
example_config_checks() {
  local dsn rootcert
  dsn=$(sed -n 's/^dsn = "\(.*\)"$/\1/p' "$root/etc/qlsched/replica.toml.example")
  echo "dsn: $dsn"
  [[ " $dsn " == *" sslmode=verify-full "* ]] || { echo "the example's dsn lacks sslmode=verify-full"; return 1; }
  rootcert=$(sed -n 's/.*sslrootcert=\([^ "]*\).*/\1/p' <<<"$dsn")
  [ -n "$rootcert" ] || { echo "the example's dsn lacks sslrootcert"; return 1; }
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=qlsched test root" -keyout "$work/root.key" -out "$work/root.crt" 2>/dev/null
  sed "s#$rootcert#$work/root.crt#" "$root/etc/qlsched/replica.toml.example" >"$work/example.toml"
  install -m 0600 /dev/null "$work/password"
  echo secret >"$work/password"
  QLSCHED__DATABASE__PASSWORD_FILE=$work/password \
    "$root/usr/bin/qlsched" check-config --config "$work/example.toml"
  # libpq's passfile rule: a password file others can read is refused, naming its mode.
  chmod 0644 "$work/password"
  local out
  if out=$(QLSCHED__DATABASE__PASSWORD_FILE=$work/password \
      "$root/usr/bin/qlsched" check-config --config "$work/example.toml" 2>&1); then
    echo "check-config accepted a 0644 password file"; return 1
  fi
  echo "$out"
  grep -q "database.password_file = $work/password: .*0644" <<<"$out"
}
check "the example replica file (sslmode=verify-full) passes check-config; a 0644 password file does not" \
  example_config_checks

# The unit's exposure as systemd-analyze scores it offline (0 = locked down, 10 = exposed):
# at most 1.5 (--threshold is in tenths).
unit_exposure() {
  local out status=0
  out=$(systemd-analyze security --offline=true --threshold=15 --no-pager \
    "$root/lib/systemd/system/qlsched@.service" 2>&1) || status=$?
  grep -E '^(✗|→)' <<<"$out" || echo "$out" | tail -n 5
  [ "$status" -eq 0 ] || { echo "exposure above 1.5 (systemd-analyze exit $status)"; return 1; }
}
check "systemd-analyze security --offline: qlsched@.service exposure at most 1.5" unit_exposure

unit_verifies() {
  local dir=$work/unit
  mkdir -p "$dir"
  grep -qx 'ExecStart=/usr/bin/qlsched run --config /etc/qlsched/%i.toml' \
    "$root/lib/systemd/system/qlsched@.service" || { echo "ExecStart is not /usr/bin/qlsched"; return 1; }
  # verify checks that ExecStart is executable: point it at the unpacked binary.
  sed "s#/usr/bin/qlsched#$root/usr/bin/qlsched#g" "$root/lib/systemd/system/qlsched@.service" \
    >"$dir/qlsched@.service"
  local out status=0
  out=$(systemd-analyze verify "$dir/qlsched@a.service" 2>&1) || status=$?
  echo "${out:-systemd-analyze verify: clean}"
  [ "$status" -eq 0 ] || return 1
  if echo "$out" | grep -q "qlsched@"; then return 1; fi
}
check "systemd-analyze verify passes on the unpacked unit" unit_verifies

# ---------------------------------------------------------------- man pages and completions
man_pages_render_cleanly() {
  local page err bad=0
  for page in "$root"/usr/share/man/man1/*.1.gz; do
    err=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$page" 2>&1 >/dev/null)
    err+=$(zcat "$page" | groff -man -Tutf8 -ww -z 2>&1)
    if [ -n "$err" ]; then echo "$(basename "$page"): $err"; bad=1; else echo "$(basename "$page"): clean"; fi
  done
  return $bad
}
check "man -l and groff -man -Tutf8 -ww render every page without warnings" man_pages_render_cleanly

# The subcommands the binary lists in its help (clap's "Commands:" block).
commands_of() {
  "$root/usr/bin/qlsched" "$@" --help | sed -n '/^Commands:/,/^$/p' | awk 'NR > 1 && NF {print $1}' | grep -vx help
}
man_pages_cover_every_command() {
  local group member page bad=0
  [ -n "$(commands_of)" ] || { echo "no commands found in qlsched --help"; return 1; }
  for group in $(commands_of); do
    page=$root/usr/share/man/man1/qlsched-$group.1.gz
    [ -f "$page" ] || { echo "no page for qlsched $group"; bad=1; continue; }
    for member in $(commands_of "$group"); do
      zgrep -qi "^\.SH \"$group $member\"" "$page" || { echo "qlsched-$group.1 lacks $group $member"; bad=1; }
    done
    echo "qlsched-$group.1: $(commands_of "$group" | tr '\n' ' ')"
  done
  return $bad
}
check "one man page per command group, covering every member command" man_pages_cover_every_command

bash_completion_completes() {
  local comp=$root/usr/share/bash-completion/completions/qlsched
  complete_words() {
    bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
             _qlsched qlsched "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}";
             echo "${COMPREPLY[*]}"' _ "$comp" "$@"
  }
  local top db misfire
  top=$(complete_words qlsched d); db=$(complete_words qlsched db "")
  misfire=$(complete_words qlsched trigger publish --misf)
  echo "qlsched d<TAB> -> $top"; echo "qlsched db <TAB> -> $db"; echo "qlsched trigger publish --misf<TAB> -> $misfire"
  [ "$top" = db ] && [ "$misfire" = --misfire ] &&
    [[ " $db " == *" bootstrap "* && " $db " == *" migrate "* && " $db " == *" check "* ]]
}
check "bash completion completes commands and options" bash_completion_completes

zsh_fish_completions_parse() {
  zsh -n "$root/usr/share/zsh/vendor-completions/_qlsched" &&
    fish --no-execute "$root/usr/share/fish/vendor_completions.d/qlsched.fish" &&
    fish -c "source $root/usr/share/fish/vendor_completions.d/qlsched.fish; complete -C 'qlsched trigger '" \
      | tee "$work/fish" | grep -q '^publish' && echo "fish: qlsched trigger <TAB> -> $(cut -f1 "$work/fish" | tr '\n' ' ')"
}
check "zsh and fish completions parse; fish completes subcommands" zsh_fish_completions_parse

# ---------------------------------------------------------------- alert rules
check "promtool check rules (repository and packaged copy)" \
  promtool check rules contrib/prometheus/qlsched-alerts.yml "$root/usr/share/qlsched/prometheus/qlsched-alerts.yml"
check "promtool test rules: every alert fires on one series and not on another" \
  promtool test rules contrib/prometheus/qlsched-alerts.test.yml
every_alert_is_tested() {
  local alert bad=0
  for alert in $(sed -n 's/^ *- alert: *//p' contrib/prometheus/qlsched-alerts.yml); do
    grep -q "alertname: $alert\$" contrib/prometheus/qlsched-alerts.test.yml || { echo "$alert has no test"; bad=1; }
  done
  return $bad
}
check "every alert has a promtool test" every_alert_is_tested
# Two clusters in one Prometheus must not mix: the scrape job is named once (the recording
# rule qlsched:up) and every aggregation keeps the job label.
the_job_is_named_once_and_kept() {
  local rules=contrib/prometheus/qlsched-alerts.yml bad=0 n
  n=$(grep -v '^ *#' "$rules" | grep -c 'job=')
  [ "$n" -eq 1 ] || { echo "the job is named $n times in $rules (want 1: qlsched:up)"; bad=1; }
  if grep -v '^ *#' "$rules" | grep -E '(sum|max|min|count|avg)( by \(([a-z, ]*)\))? *\(' \
       | grep -vE '(sum|max|min|count|avg) by \((job|job, [a-z, ]*)\)' | grep -q .; then
    echo "an aggregation drops the job label:"
    grep -v '^ *#' "$rules" | grep -E '(sum|max|min|count|avg)( by \(([a-z, ]*)\))? *\(' \
      | grep -vE '(sum|max|min|count|avg) by \((job|job, [a-z, ]*)\)'
    bad=1
  fi
  return $bad
}
check "alert rules name the scrape job once and aggregate by job" the_job_is_named_once_and_kept

# ---------------------------------------------------------------- real install, upgrade, purge
install_and_check() {
  dpkg --purge qlsched >/dev/null 2>&1 || true
  echo "# dpkg -i $deb"
  dpkg -i "$deb"
  local pw
  pw=$(getent passwd qlsched) || { echo "no qlsched user"; return 1; }
  echo "user: $pw"
  IFS=: read -r _ _ uid gid _ home shell <<<"$pw"
  [ "$uid" -lt 1000 ]
  [ "$home" = /nonexistent ]
  [ "$shell" = /usr/sbin/nologin ]
  [ "$(getent group "$gid" | cut -d: -f1)" = qlsched ]
  echo "/etc/qlsched: $(stat -c '%a %U:%G' /etc/qlsched)"
  [ "$(stat -c '%a %U:%G' /etc/qlsched)" = "750 root:qlsched" ]
  [ -f /etc/qlsched/replica.toml.example ]
  cmp "$root/lib/systemd/system/qlsched@.service" /lib/systemd/system/qlsched@.service
  if [ -d /run/systemd/system ]; then
    systemctl cat qlsched@a | grep -x 'ExecStart=/usr/bin/qlsched run --config /etc/qlsched/%i.toml'
  else
    echo "systemd is not PID 1 here ($(ps -o comm= -p 1)): checked the unit file on disk"
    grep -x 'ExecStart=/usr/bin/qlsched run --config /etc/qlsched/%i.toml' /lib/systemd/system/qlsched@.service
  fi
  /usr/bin/qlsched --version
  man -w qlsched-trigger
}
check "dpkg -i: qlsched system user, /etc/qlsched 0750 root:qlsched, the packaged unit" install_and_check

# On an upgrade, postinst restarts a running instance only if the new binary accepts its
# database (`qlsched db check --config` with the instance's file, as the service user, with
# the password file the unit hands over: instance `ready` reads its credential under
# /run/credentials, owned by qlsched as systemd leaves it; instance `rootonly`'s config is
# readable by root alone, so its check fails: it does not run as root). systemd is not PID 1 here,
# so the installed postinst runs in a mount namespace whose /run has /run/systemd/system
# (what it looks for), with a stub systemctl first on PATH that lists two running instances
# and records every call. A throwaway PostgreSQL holds the database of instance `ready`
# (migrated) and that of instance `behind` (bootstrapped, not migrated: what a new binary
# meets before `db migrate`).
postinst_restarts_only_ready_instances() {
  local pgdir port stub=$work/stub out want
  pgdir=$(mktemp -d /tmp/qlsched-pkgtest-pg.XXXXXX)
  # shellcheck disable=SC2064 # expanded now: the locals are gone when the subshell exits
  trap "pg_stop '$pgdir' immediate; rm -rf '$pgdir' /etc/qlsched/ready.toml /etc/qlsched/behind.toml /etc/qlsched/rootonly.toml" EXIT
  port=$(free_port)
  pg_start "$pgdir" "$port"
  local su="host=127.0.0.1 port=$port user=postgres dbname=postgres"
  for db in ready behind; do
    /usr/bin/qlsched db bootstrap --superuser-dsn "$su" --database "qlsched_$db" >/dev/null
    printf '[replica]\nid = "%s"\n\n[database]\ndsn = "host=127.0.0.1 port=%s user=qlsched_runtime dbname=qlsched_%s"\n' \
      "$db" "$port" "$db" | install -m 0640 -o root -g qlsched /dev/stdin "/etc/qlsched/$db.toml"
  done
  local cred=/run/credentials/qlsched@ready.service/db-password
  printf 'password_file = "%s"\n' "$cred" >>/etc/qlsched/ready.toml
  printf '[replica]\nid = "rootonly"\n\n[database]\ndsn = "host=127.0.0.1 port=%s user=qlsched_runtime dbname=qlsched_ready"\n' \
    "$port" | install -m 0600 -o root -g root /dev/stdin /etc/qlsched/rootonly.toml
  /usr/bin/qlsched db migrate --dsn "host=127.0.0.1 port=$port user=qlsched_owner dbname=qlsched_ready" >/dev/null
  install -m 0600 /dev/null "$work/ready-password"
  echo unused >"$work/ready-password"
  QLSCHED__DATABASE__PASSWORD_FILE=$work/ready-password /usr/bin/qlsched db check --config /etc/qlsched/ready.toml
  if want=$(/usr/bin/qlsched db check --config /etc/qlsched/behind.toml 2>&1); then
    echo "db check passes on the unmigrated database"; return 1
  fi
  mkdir -p "$stub"
  cat >"$stub/systemctl" <<STUB
#!/bin/sh
echo "systemctl \$*" >>"$stub/calls"
case "\$1" in
  list-units) printf '%s\n' 'qlsched@behind.service loaded active running qlsched replica behind' \\
                             'qlsched@ready.service  loaded active running qlsched replica ready' \\
                             'qlsched@rootonly.service loaded active running qlsched replica rootonly' ;;
  show) echo qlsched ;;
esac
STUB
  chmod +x "$stub/systemctl"
  : >"$stub/calls"
  echo "# postinst configure 0.1.0-1   (mount namespace with /run/systemd/system, stub systemctl)"
  out=$(PATH="$stub:$PATH" unshare --mount --propagation private \
    sh -c 'mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system "${1%/*}" &&
           echo unused >"$1" && chown -R qlsched:qlsched "${1%/*}" && chmod 0400 "$1" &&
           chmod 0500 "${1%/*}" && shift && exec "$@"' \
    sh "$cred" sh /var/lib/dpkg/info/qlsched.postinst configure 0.1.0-1 2>&1)
  echo "$out"
  echo "# systemctl calls:"; cat "$stub/calls"
  grep -qx 'systemctl try-restart qlsched@ready.service' "$stub/calls"
  if grep 'try-restart' "$stub/calls" | grep -v 'qlsched@ready.service'; then
    echo "postinst restarted more than qlsched@ready.service"; return 1
  fi
  grep -q 'qlsched@ready.service: restarted on the new binary' <<<"$out"
  grep -q 'qlsched@behind.service: NOT restarted, still running the previous binary' <<<"$out"
  grep -q 'qlsched@rootonly.service: NOT restarted, still running the previous binary' <<<"$out"
  grep -q 'rootonly.toml.*Permission denied' <<<"$out"
  # The check's own message, and what to do.
  while IFS= read -r line; do
    grep -qF -- "$line" <<<"$out" || { echo "the console lacks the check's line: $line"; return 1; }
  done <<<"$want"
  grep -qF 'runuser -u qlsched -- qlsched db check --config /etc/qlsched/behind.toml && systemctl restart qlsched@behind.service' <<<"$out"
}
check "postinst on an upgrade restarts only the instances whose db check passes, and says so" \
  postinst_restarts_only_ready_instances

upgrade_keeps_configs() {
  printf '[replica]\nid = "a"\n' | install -m 0640 -o root -g qlsched /dev/stdin /etc/qlsched/a.toml
  echo "# edited by the admin" >>/etc/qlsched/replica.toml.example
  # The same package with a higher version: dpkg runs the real upgrade path.
  dpkg-deb -R "$deb" "$work/next"
  sed -i 's/^Version: .*/&+upgrade1/' "$work/next/DEBIAN/control"
  dpkg-deb --build --root-owner-group "$work/next" "$work/qlsched_next.deb" >/dev/null
  echo "# dpkg -i qlsched_next.deb   (version $(dpkg-deb -f "$work/qlsched_next.deb" Version))"
  dpkg -i "$work/qlsched_next.deb"
  [ "$(dpkg-query -W -f='${Version}' qlsched)" = "$(dpkg-deb -f "$work/qlsched_next.deb" Version)" ]
  grep -qx 'id = "a"' /etc/qlsched/a.toml
  grep -qx '# edited by the admin' /etc/qlsched/replica.toml.example
  [ "$(stat -c '%a %U:%G' /etc/qlsched)" = "750 root:qlsched" ]
  echo "a.toml and the edited conffile kept; /etc/qlsched $(stat -c '%a %U:%G' /etc/qlsched)"
}
check "upgrade to a newer version keeps replica files and an edited conffile" upgrade_keeps_configs

remove_keeps_purge_deletes() {
  echo "# dpkg -r qlsched"
  dpkg -r qlsched
  [ ! -e /usr/bin/qlsched ]
  [ ! -e /lib/systemd/system/qlsched@.service ]
  [ -f /etc/qlsched/a.toml ]
  [ -f /etc/qlsched/replica.toml.example ]
  echo "after remove: binary and unit gone, /etc/qlsched kept: $(ls /etc/qlsched | tr '\n' ' ')"
  echo "# dpkg --purge qlsched"
  dpkg --purge qlsched
  [ ! -e /etc/qlsched ]
  if dpkg -s qlsched >/dev/null 2>&1; then echo "still installed"; return 1; fi
  echo "after purge: /etc/qlsched gone; the qlsched user stays: $(getent passwd qlsched)"
}
check "remove keeps /etc/qlsched; purge deletes it" remove_keeps_purge_deletes

# Where systemd-sysusers is absent (a container without systemd), postinst creates the user.
sysusers_fallback() {
  getent passwd qlsched >/dev/null && userdel qlsched
  dpkg-divert --quiet --local --rename --divert /bin/systemd-sysusers.qlsched-test --add /bin/systemd-sysusers
  if command -v systemd-sysusers; then echo "systemd-sysusers still found"; return 1; fi
  echo "# dpkg -i $deb   (systemd-sysusers diverted away)"
  dpkg -i "$deb"
  getent passwd qlsched
  [ "$(getent passwd qlsched | cut -d: -f6,7)" = /nonexistent:/usr/sbin/nologin ]
  [ "$(stat -c '%a %U:%G' /etc/qlsched)" = "750 root:qlsched" ]
  dpkg --purge qlsched
  dpkg-divert --quiet --local --rename --remove /bin/systemd-sysusers
  command -v systemd-sysusers >/dev/null
}
if command -v systemd-sysusers >/dev/null; then
  check "without systemd-sysusers, postinst creates the user with useradd" sysusers_fallback
fi

finish
