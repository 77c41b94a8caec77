# shellcheck shell=bash
# The one shell library of taskherd's scripts: the services (scripts/services.sh), the cluster
# (e2e/cluster/*.sh), the images (images/*.sh) and the fresh-machine rehearsal all source it.
# Source it; do not execute it. It sets no shell options (each script sets its own), so sourcing it
# changes nothing but the functions and variables below.
#
#   log, die, need_root          one line format for every script: "HH:MM:SS [tag] message"
#   run_step                     a long command with its output in a log file and a heartbeat line
#   step_done, steps_summary     the steps of one make run and the table printed at its end
#   apt_install                  the only way the project installs Debian packages (and records them)
#   wait_for                     a bounded wait that says what it waits for
#   pidfile_pid, stop_pidfile    processes the scripts started, known by PID file, never by name
#   port_in_use                  a listening TCP port on this machine

TASKHERD_HOME="${TASKHERD_HOME:-$HOME/.cache/taskherd}"
export TASKHERD_HOME
# Each script names itself in its log lines (LOG_TAG=cluster, services, images, …) before sourcing.
LOG_TAG="${LOG_TAG:-taskherd}"

log() { printf '%s [%s] %s\n' "$(date -u +%H:%M:%S)" "$LOG_TAG" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (${1:-it installs packages and starts daemons})"; }

# 45s, 4m05s, 1h02m
fmt_duration() {
    local s=$1
    if ((s < 60)); then
        printf '%ds' "$s"
    elif ((s < 3600)); then
        printf '%dm%02ds' $((s / 60)) $((s % 60))
    else
        printf '%dh%02dm' $((s / 3600)) $((s % 3600 / 60))
    fi
}
# An estimate, rounded the way a person says it: ~40s, ~9m, ~1h05m.
fmt_estimate() {
    local s=$1
    if ((s < 120)); then printf '~%ds' "$s"; elif ((s < 3600)); then printf '~%dm' $(((s + 30) / 60)); else printf '~%s' "$(fmt_duration "$s")"; fi
}

# ---- expected durations -------------------------------------------------------------------------
# A step's expected duration is how long it took the last time it ran on this machine
# ($TASKHERD_HOME/timings/KEY, seconds), else its first-run estimate below. The estimates are the
# durations measured in a cold `make test` on this project's kind of machine (2 cores, Debian
# bookworm, empty caches, 2026-12-01); docs/cluster.md has the full figures.
TIMINGS_DIR="$TASKHERD_HOME/timings"
first_run_seconds() {
    case "$1" in
    go-kubernetes) echo 760 ;;       # six binaries; the longest step of a cold run
    go-etcd) echo 85 ;;
    go-helm) echo 230 ;;
    go-coredns) echo 520 ;;
    go-crictl) echo 170 ;;
    go-kind) echo 180 ;;
    go-toolchain) echo 60 ;;         # the Go toolchain from the module proxy (only without a go >= GO_MIN_VERSION)
    image-base) echo 115 ;;          # debootstrap minbase + python3
    image-pause | image-coredns) echo 5 ;;
    image-wheels) echo 35 ;;         # pip wheel of taskherd[operator] and its dependencies
    image-worker | image-operator) echo 35 ;;
    venv) echo 40 ;;
    checkov-venv) echo 40 ;;
    apt-*) echo 15 ;;                # one apt-get update + install: 5-15 s each here
    *) return 1 ;;
    esac
}
expected_seconds() {
    local f="$TIMINGS_DIR/$1"
    if [ -s "$f" ]; then cat "$f"; else first_run_seconds "$1" || true; fi
}
remember_seconds() {
    mkdir -p "$TIMINGS_DIR" && echo "$2" >"$TIMINGS_DIR/$1"
}

# ---- steps of one make run ------------------------------------------------------------------------
# The Makefile points TASKHERD_STEPS_FILE at one file per top-level make (sub-makes inherit it);
# each step appends "name<TAB>outcome<TAB>seconds<TAB>end (epoch)<TAB>detail<TAB>exit status". Outside
# make it is unset and nothing is recorded.
#
# step_done NAME OUTCOME SECONDS [DETAIL] [EXIT_STATUS]: OUTCOME is built, installed, started,
# reused, passed or failed. "reused" is recorded only when this run has no row for NAME yet (a
# component built earlier in the same run stays "built").
step_done() {
    local file=${TASKHERD_STEPS_FILE:-}
    [ -n "$file" ] || return 0
    mkdir -p "$(dirname "$file")"
    if [ "$2" = reused ] && [ -f "$file" ] && cut -f1 "$file" | grep -qxF -- "$1"; then return 0; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(date +%s)" "${4:-}" "${5:-0}" >>"$file"
}

# steps_summary FILE TITLE [START]: the table of one run's steps, then its wall-clock time (from
# START, in epoch seconds, when given; else from the start of the first step).
steps_summary() {
    local file=$1 title=$2 start=${3:-}
    [ -s "$file" ] || { echo "== $title: no setup step recorded =="; return 0; }
    awk -F'\t' -v title="$title" -v first="$start" -v now="$(date +%s)" '
        function dur(s) {
            if (s < 60) return sprintf("%ds", s)
            if (s < 3600) return sprintf("%dm%02ds", int(s / 60), s % 60)
            return sprintf("%dh%02dm", int(s / 3600), int(s % 3600 / 60))
        }
        NR == 1 { start_given = (first != ""); w = length("wall clock") }
        {
            n++; name[n] = $1; outcome[n] = $2; secs[n] = $3; detail[n] = $5
            if (length(name[n]) > 44) name[n] = substr(name[n], 1, 41) "..."
            if (length(name[n]) > w) w = length(name[n])
            start = $4 - $3; if (first == "" || start < first) first = start
            if ($4 > last) last = $4
        }
        END {
            printf "\n== %s: steps ==\n", title
            for (i = 1; i <= n; i++) {
                t = (outcome[i] == "reused") ? "" : dur(secs[i])
                line = sprintf("  %-" w "s  %-9s %8s", name[i], outcome[i], t)
                d = detail[i]; gsub(/^=+ *| *=+$/, "", d)   # pytest frames its closing line in =
                if (d != "") line = line "  " d
                print line
            }
            if (start_given) last = now
            printf "  %-" w "s  %-9s %8s\n", "wall clock", "", dur(last - first)
        }' "$file"
}

# ---- long steps: output in a log file, a heartbeat on the terminal ---------------------------------
# Every step that can take more than ~20 s runs through run_step: the terminal gets a line when it
# starts (with the expected duration and the log's path), a line every HEARTBEAT_SECONDS while it
# runs ("building kubernetes v1.34.4 … 4m30s of ~11m") and one when it ends; a failure prints the
# tail of the log and its path. Logs: $TASKHERD_HOME/logs/KEY.log (the last run of each step).
HEARTBEAT_SECONDS=${TASKHERD_HEARTBEAT_SECONDS:-20}

# run_step NAME KEY COMMAND...: records NAME as "built". KEY names the log and the remembered
# duration. COMMAND may be a shell function; it runs in a subshell with errexit on, but only when
# run_step itself is called as a plain command (bash ignores errexit inside anything called from
# an `if`, `&&` or `||`).
run_step() { run_step_as built "$@"; }

# run_step_as OUTCOME NAME KEY COMMAND...: the same, recording OUTCOME (installed, started, …).
run_step_as() {
    local outcome=$1 name=$2 key=$3
    shift 3
    local logf="$TASKHERD_HOME/logs/$key.log" verb expected t0=$SECONDS rc errexit='' me=$BASHPID
    verb=$(step_verb "$outcome")
    expected=$(expected_seconds "$key")
    mkdir -p "${logf%/*}"
    log "$verb $name${expected:+ (expect $(fmt_estimate "$expected"))}; log: $logf"
    : >"$logf.running"
    heartbeat "$logf.running" "$verb $name" "$expected" "$me" &
    local heartbeat_pid=$!
    [[ $- == *e* ]] && errexit=1
    set +e
    (
        set -e
        "$@"
    ) >"$logf" 2>&1 </dev/null
    rc=$?
    [ -z "$errexit" ] || set -e
    rm -f "$logf.running"
    wait "$heartbeat_pid" 2>/dev/null || true
    local took=$((SECONDS - t0))
    if [ "$rc" -eq 0 ]; then
        remember_seconds "$key" "$took"
        step_done "$name" "$outcome" "$took"
        log "$name: $outcome in $(fmt_duration "$took")"
        return 0
    fi
    step_done "$name" failed "$took" "" "$rc"
    log "FAILED: $verb $name (exit status $rc after $(fmt_duration "$took")); the last lines of its log:"
    tail -n 25 "$logf" | sed 's/^/    | /' >&2
    log "full log: $logf"
    return "$rc"
}
step_verb() {
    case "$1" in
    built) echo building ;; installed) echo installing ;; started) echo starting ;; removed) echo removing ;;
    *) echo running ;;
    esac
}
# heartbeat FILE LABEL EXPECTED PARENT_PID: a line every HEARTBEAT_SECONDS while FILE exists and
# the shell that started the step lives (an interrupted script leaves no heartbeat behind).
heartbeat() {
    local file=$1 label=$2 expected=$3 parent=$4 start=$SECONDS next=$HEARTBEAT_SECONDS elapsed
    while [ -e "$file" ] && kill -0 "$parent" 2>/dev/null; do
        sleep 1
        elapsed=$((SECONDS - start))
        if ((elapsed < next)) || [ ! -e "$file" ]; then continue; fi
        next=$((next + HEARTBEAT_SECONDS))
        if [ -z "$expected" ]; then
            log "$label … $(fmt_duration "$elapsed")"
        elif ((elapsed <= expected)); then
            log "$label … $(fmt_duration "$elapsed") of $(fmt_estimate "$expected")"
        else
            log "$label … $(fmt_duration "$elapsed") (expected $(fmt_estimate "$expected"); still running)"
        fi
    done
}

# ---- Debian packages ---------------------------------------------------------------------------------
# apt_install PKG...: installs what is missing (`apt-get update` only then, no recommends) and
# records in $APT_STATE_DIR/apt-installed.list every package that was not on the machine before,
# dependencies included (the diff of dpkg's list before and after). The first install ever also
# saves the machine's own list as dpkg-pristine.txt. Both live outside $TASKHERD_HOME, which the
# fresh-machine rehearsal (scripts/fresh-test.sh) empties, and tell it what it may purge.
APT_STATE_DIR=${TASKHERD_APT_STATE_DIR:-/var/lib/taskherd}
APT_INSTALLED_LIST="$APT_STATE_DIR/apt-installed.list"
DPKG_PRISTINE_LIST="$APT_STATE_DIR/dpkg-pristine.txt"

# installed packages, one name a line, sorted bytewise (for comm)
dpkg_installed() {
    dpkg-query -W -f='${db:Status-Status} ${Package}\n' 2>/dev/null | awk '$1 == "installed" {print $2}' | LC_ALL=C sort -u
}
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        step_done "packages $*" reused 0
        return 0
    fi
    need_root "apt-get install ${missing[*]}"
    mkdir -p "$APT_STATE_DIR"
    local lock before rc=0
    # one install at a time, so that the before/after diff is this install's alone
    exec {lock}>"$APT_STATE_DIR/apt-install.lock"
    flock -n "$lock" || {
        log "waiting for another taskherd package install to finish ($APT_STATE_DIR/apt-install.lock)"
        flock "$lock"
    }
    before=$(mktemp)
    dpkg_installed >"$before"
    if [ ! -s "$DPKG_PRISTINE_LIST" ]; then
        cp "$before" "$DPKG_PRISTINE_LIST"
        log "recorded the packages this machine had before taskherd's first install: $DPKG_PRISTINE_LIST"
    fi
    run_step_as installed "packages ${missing[*]}" "apt-$(IFS=+ && echo "${missing[*]}")" \
        apt_get_install "$lock" "${missing[@]}" || rc=$?
    # recorded after a failure too: a half-finished install leaves packages behind as well
    { cat "$APT_INSTALLED_LIST" 2>/dev/null || true; dpkg_installed | LC_ALL=C comm -13 "$before" -; } |
        LC_ALL=C sort -u >"$APT_INSTALLED_LIST.new"
    mv "$APT_INSTALLED_LIST.new" "$APT_INSTALLED_LIST"
    rm -f "$before"
    exec {lock}>&-
    return "$rc"
}
# apt_get_install LOCK_FD PKG...: written with && so it does not rely on errexit (apt_install calls
# it behind `||`). The lock is not passed on: a daemon a package's script starts must not hold it.
apt_get_install() {
    local lock=$1
    shift
    export DEBIAN_FRONTEND=noninteractive
    apt-get -q -o DPkg::Lock::Timeout=600 update {lock}>&- &&
        apt-get -y -q -o DPkg::Lock::Timeout=600 install --no-install-recommends "$@" {lock}>&-
}

# ---- waiting -----------------------------------------------------------------------------------------
# wait_for DESCRIPTION SECONDS COMMAND...: polls every 0.5 s, a progress line every 10 s; on timeout
# says what it waited for and what the last attempt said, and returns 1.
wait_for() {
    local what=$1 limit=$2 start=$SECONDS next=10
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS - start >= limit)); then
            log "timed out after ${limit}s waiting for $what; the last attempt said:"
            "$@" 2>&1 | tail -5 >&2 || true
            return 1
        fi
        if ((SECONDS - start >= next)); then
            log "waiting for $what ($((SECONDS - start))s of at most ${limit}s)"
            next=$((next + 10))
        fi
        sleep 0.5
    done
}

# ---- processes the scripts started -------------------------------------------------------------------
# A PID file holds "PID" or "PID EXE". pidfile_pid FILE [EXE] prints the PID when that process lives
# and, if an executable is known (the file's second field or EXE), still runs it: a stale file
# whose PID was reused by something else never names a victim.
pidfile_pid() {
    local file=$1 want=${2:-} pid exe
    [ -f "$file" ] || return 1
    read -r pid exe <"$file" || true
    want=${want:-${exe:-}}
    [[ ${pid:-} =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] || return 1
    if [ -n "$want" ]; then
        [ "$(readlink "/proc/$pid/exe" 2>/dev/null | sed 's/ (deleted)$//')" = "$want" ] || return 1
    fi
    echo "$pid"
}
# stop_pidfile NAME FILE [GRACE_SECONDS] [EXE]: SIGTERM, SIGKILL after the grace period (default
# 15 s); removes FILE.
stop_pidfile() {
    local name=$1 file=$2 grace=${3:-15} want=${4:-} pid i
    if pid=$(pidfile_pid "$file" "$want"); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < grace * 10; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        if [ -d "/proc/$pid" ]; then
            log "$name (pid $pid) ignored SIGTERM for ${grace}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        fi
        log "stopped $name (pid $pid)"
    fi
    rm -f "$file"
}

port_in_use() { ss -Hltn "sport = :$1" | grep -q .; }
