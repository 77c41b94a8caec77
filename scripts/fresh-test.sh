#!/usr/bin/env bash
# The fresh-machine rehearsal (`make fresh-test`): a first run of the two commands on this machine,
# as close to a newcomer's as this machine allows.
#
#   1. stops what runs: the local cluster (`make cluster-down`, for every TASKHERD_HOME that has one),
#      the private dockerds under a TASKHERD_HOME, the loopback services (`scripts/services.sh down`),
#      the demo's forwarders;
#   2. purges the Debian packages the machine did not come with (everything installed since
#      /var/lib/taskherd/dpkg-pristine.txt; scripts/lib.sh apt_install records it) with their data;
#   3. clones the current commit and runs `make test`, then `make demo DEMO_SHORT=1`, each with a new,
#      empty TASKHERD_HOME and services directory, timing every step;
#   4. prints the timing table, keeps every log in the run folder, and starts again the cluster and
#      services that ran before (FRESH_KEEP=1 leaves the rehearsal's running instead).
#
# It stops services and a cluster other people may be using, so it refuses to run without
# TASKHERD_FRESH_CONFIRM=yes. DRY_RUN=1 prints the plan, computed for real, and changes nothing.
#
# Settings (environment or make variables):
#   FRESH_DIR      the run folder (default /var/tmp/taskherd-fresh/<UTC time>)
#   FRESH_CACHES=1 also start from empty caches: Go's module and build caches and pip's cache (new
#                  directories in the run folder) and apt's archive (`apt-get clean`)
#   FRESH_KEEP=1   leave the rehearsal's cluster and services running afterwards
#   PRISTINE=FILE  one-time seed of the machine's own package list (one name a line), for a machine
#                  where packages were installed before apt_install recorded them
set -euo pipefail
LOG_TAG=fresh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
need_root "it stops services, purges packages and runs make test"

FRESH_ROOT=/var/tmp/taskherd-fresh
REHEARSAL=${FRESH_DIR:-$FRESH_ROOT/$(date -u +%Y%m%dT%H%M%SZ)}
DEFAULT_HOME=$HOME/.cache/taskherd
DEFAULT_SERVICES_DIR=/var/lib/taskherd/services
CLUSTER_OWNER_FILE=/run/taskherd-cluster.owner   # e2e/cluster/lib.sh HOST_OWNER_FILE
COMMIT=$(git -C "$REPO_ROOT" rev-parse HEAD)
DRY_RUN=${DRY_RUN:-}
[ "$DRY_RUN" = 0 ] && DRY_RUN=

# Data the purged packages leave outside their package files, per package.
data_dirs_of() {
    case "$1" in
    rabbitmq-server) echo /var/lib/rabbitmq /var/log/rabbitmq /etc/rabbitmq ;;
    redis-server) echo /var/lib/redis /var/log/redis /etc/redis ;;
    prometheus) echo /var/lib/prometheus /var/log/prometheus /etc/prometheus ;;
    prometheus-alertmanager) echo /var/lib/prometheus/alertmanager ;;
    docker.io) echo /var/lib/docker /etc/docker ;;
    containerd) echo /var/lib/containerd /etc/containerd /opt/containerd ;;
    esac
}

# ---- what there is ----------------------------------------------------------------------------------
unique() { awk 'NF && !seen[$0]++'; }
# Every TASKHERD_HOME that may hold a cluster: the one owning the host's cluster pieces, the caller's,
# the default.
candidate_homes() {
    { cat "$CLUSTER_OWNER_FILE" 2>/dev/null || true; echo "$TASKHERD_HOME"; echo "$DEFAULT_HOME"; } |
        while read -r h; do readlink -f "$h" 2>/dev/null || echo "$h"; done | unique
}
live_pids_in() {  # pid files matching a glob → "PID FILE" of the live ones
    local f pid
    for f in "$@"; do
        pid=$(pidfile_pid "$f") && echo "$pid $f"
    done
    return 0
}
cluster_homes() {  # homes whose cluster has a live component
    local h
    for h in $(candidate_homes); do
        [ -n "$(live_pids_in "$h"/cluster/run/*.pid)" ] && echo "$h"
    done
    return 0
}
services_dirs() {  # services directories with a live service (default, caller's)
    local d
    for d in $(printf '%s\n' "${TASKHERD_SERVICES_DIR:-}" "$DEFAULT_SERVICES_DIR" | unique); do
        # postmaster.pid starts with the server's PID, the way the other pid files do
        [ -n "$(live_pids_in "$d"/*/pid "$d/postgres/data/postmaster.pid")" ] && echo "$d"
    done
    return 0
}
# The processes step 1 stops: those of the pid files of the clusters, services and demo forwarders
# above, with their descendants, and the containerd shims of those clusters.
stopped_by_step_1() {
    local h d
    {
        for h in $(candidate_homes); do live_pids_in "$h"/demo/forward-*.pid | cut -d' ' -f1; done
        private_dockerds | cut -d' ' -f1
        for h in "${CLUSTER_HOMES[@]}"; do
            live_pids_in "$h"/cluster/run/*.pid | cut -d' ' -f1
        done
        for d in "${SERVICES_DIRS[@]}"; do live_pids_in "$d"/*/pid "$d/postgres/data/postmaster.pid" | cut -d' ' -f1; done
    } | sort -u >"$REHEARSAL/.roots"
    ps -eo pid=,ppid= | awk 'NR == FNR {keep[$1] = 1; next} {parent[$1] = $2}
        END {for (p in parent) {q = p; while (q in parent && !(q in keep) && q > 1) q = parent[q]; if (q in keep) print p}}' \
        "$REHEARSAL/.roots" -
}
# fate PID: what step 1 does about a process that blocks a fresh start
fate() {
    local h
    case " $STOPPED_BY_STEP_1 " in *" $1 "*) echo "stopped in step 1"; return 0 ;; esac
    if [ "$(readlink "/proc/$1/exe" 2>/dev/null | sed 's|.*/||')" = epmd ]; then
        echo "stopped in step 1 (epmd -kill)"
        return 0
    fi
    # A containerd shim outlives its containerd by design; the shims of the cluster's containerd
    # (down.sh kills them) and of a private dockerd's (they end with its containers) are ours.
    for h in $(candidate_homes); do
        if tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- "-address $h/"; then
            echo "stopped in step 1 (a shim of a containerd under $h)"
            return 0
        fi
    done
    echo "NOT started by the project's scripts: refused"
}
port_holders() { ss -Hltnp "sport = :$1" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u; }
# What would survive step 1 and keep the machine from being fresh: a process of another origin
# holding a service port or running a binary of a package to purge. The run refuses to start then.
foreign_blockers() {
    local port pid
    {
        for port in $(service_ports); do port_holders "$port"; done
        [ ${#PURGE[@]} -eq 0 ] || processes_of "${PURGE[@]}" | cut -d' ' -f1
    } | sort -u | while read -r pid; do
        case "$(fate "$pid")" in NOT*) echo "$pid $(readlink "/proc/$pid/exe" 2>/dev/null) $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)" ;; esac
    done
}
# Private dockerds the project's scripts start under a TASKHERD_HOME (the image build's, kind's),
# each with its pid file: "PID FILE" of the live ones.
private_dockerds() {
    local h f exe pid
    exe=$(readlink -f "$(command -v dockerd 2>/dev/null || echo /usr/sbin/dockerd)")
    for h in $(candidate_homes); do
        [ -d "$h" ] || continue
        find "$h" -maxdepth 3 -name dockerd.pid 2>/dev/null | while read -r f; do
            pid=$(pidfile_pid "$f" "$exe") && echo "$pid $f"
        done
    done
    return 0
}
service_ports() { grep -E '^[A-Z_]+_PORT=' "$REPO_ROOT/scripts/services.env" | cut -d= -f2; }

pristine_list() {
    if [ -s "$DPKG_PRISTINE_LIST" ]; then
        echo "$DPKG_PRISTINE_LIST"
    elif [ -n "${PRISTINE:-}" ]; then
        echo "$PRISTINE"
    else
        die "no record of the packages this machine came with ($DPKG_PRISTINE_LIST): the project's first
    package install writes it. If packages were installed before that, seed it once:
    make fresh-test PRISTINE=/path/to/list (one package name a line, taken before the first install)"
    fi
}
check_pristine() {  # a package list that misses dpkg itself is not a dpkg list
    if ! grep -qx dpkg "$1" || ! grep -qx bash "$1" || grep -qvE '^[a-z0-9][a-z0-9+.-]*$' "$1"; then
        die "$1 is not a list of Debian package names, one a line (as dpkg-query -W -f='\${Package}\\n' prints)"
    fi
}
# Packages installed now that the machine did not come with.
purge_candidates() { dpkg_installed | LC_ALL=C comm -23 - <(LC_ALL=C sort -u "$1"); }

# apt's own plan for purging them: refuse if it would take anything else with it.
check_purge_plan() {
    local plan extra
    plan=$(apt-get -s purge "$@" 2>&1) || die "apt-get -s purge failed: $plan"
    extra=$(echo "$plan" | awk '$1 == "Purg" || $1 == "Remv" {print $2}' | LC_ALL=C sort -u |
        LC_ALL=C comm -23 - <(printf '%s\n' "$@" | LC_ALL=C sort -u))
    [ -z "$extra" ] || die "purging them would also remove packages the machine came with: ${extra//$'\n'/ }"
}

# The processes that see this machine's files: a process in a container has a mount namespace of its
# own, and its binaries come from its image, not from the host's packages.
host_processes() {
    local me p
    me=$(readlink /proc/self/ns/mnt)
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$me" ] && echo "$p"
    done
    return 0
}
# Processes running a binary of a package about to be purged: "PID EXE PACKAGE".
processes_of() {
    local exes procs
    procs=$(host_processes)
    exes=$(for p in $procs; do readlink "$p/exe" 2>/dev/null | sed 's/ (deleted)$//' || true; done | LC_ALL=C sort -u)
    [ -n "$exes" ] || return 0
    # "pkg[:arch][, pkg…]: /path" for the executables dpkg knows
    # shellcheck disable=SC2086  # one path a word
    dpkg -S $exes 2>/dev/null | awk -F': ' '{n = split($1, p, ", "); for (i = 1; i <= n; i++) {sub(/:.*/, "", p[i]); print p[i], $2}}' |
        LC_ALL=C sort -u >"$REHEARSAL/.exe-packages" || true
    local p exe pkg
    for p in $procs; do
        exe=$(readlink "$p/exe" 2>/dev/null | sed 's/ (deleted)$//') || continue
        [ -n "$exe" ] || continue
        pkg=$(awk -v e="$exe" '$2 == e {print $1}' "$REHEARSAL/.exe-packages" | head -1)
        [ -n "$pkg" ] && printf '%s\n' "$@" | grep -qxF "$pkg" && echo "${p#/proc/} $exe $pkg"
    done
    return 0
}

# ---- the plan -----------------------------------------------------------------------------------------
mkdir -p "$REHEARSAL/logs"
PRISTINE_FILE=$(pristine_list)
check_pristine "$PRISTINE_FILE"
mapfile -t PURGE < <(purge_candidates "$PRISTINE_FILE")
mapfile -t CLUSTER_HOMES < <(cluster_homes)
mapfile -t SERVICES_DIRS < <(services_dirs)
STOPPED_BY_STEP_1=$(stopped_by_step_1 | tr '\n' ' ')
recorded() { [ -f "$APT_INSTALLED_LIST" ] && grep -qxF "$1" "$APT_INSTALLED_LIST"; }

plan() {
    echo "== fresh-machine rehearsal: plan =="
    echo "commit      $COMMIT ($(git -C "$REPO_ROOT" log -1 --format=%s "$COMMIT"))"
    if [ -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no)" ]; then
        echo "            (uncommitted changes in $REPO_ROOT are NOT part of it: only the commit is cloned)"
    fi
    echo "run folder  $REHEARSAL (logs, the clone, TASKHERD_HOME=home/, TASKHERD_SERVICES_DIR=services/)"
    echo
    echo "1. stop what runs"
    local h d f
    for h in "${CLUSTER_HOMES[@]}"; do echo "   make cluster-down          TASKHERD_HOME=$h"; done
    [ ${#CLUSTER_HOMES[@]} -gt 0 ] || echo "   (no local cluster runs)"
    for d in "${SERVICES_DIRS[@]}"; do echo "   scripts/services.sh down   TASKHERD_SERVICES_DIR=$d"; done
    [ ${#SERVICES_DIRS[@]} -gt 0 ] || echo "   (no loopback services of the project run)"
    for h in $(candidate_homes); do
        for f in $(live_pids_in "$h"/demo/forward-*.pid | cut -d' ' -f2); do echo "   demo forwarder             $f"; done
    done
    for f in $(private_dockerds | cut -d' ' -f2); do echo "   private dockerd            $f (and what runs in it)"; done
    echo "   epmd -kill                 (RabbitMQ's port mapper outlives the broker)"
    local port pid
    for port in $(service_ports); do
        for pid in $(port_holders "$port"); do
            printf '   port %-6s held by pid %-7s %-28s %s\n' "$port" "$pid" "$(readlink "/proc/$pid/exe" 2>/dev/null)" "$(fate "$pid")"
        done
    done
    echo
    echo "2. purge ${#PURGE[@]} Debian packages the machine did not come with (list: $PRISTINE_FILE)"
    [ "$PRISTINE_FILE" = "$DPKG_PRISTINE_LIST" ] || echo "   (first use: $PRISTINE_FILE will be copied to $DPKG_PRISTINE_LIST)"
    local pkg not_recorded=()
    for pkg in "${PURGE[@]}"; do recorded "$pkg" || not_recorded+=("$pkg"); done
    echo "   apt-get purge $(echo "${PURGE[@]}" | fold -s -w 90 | sed '2,$s/^/                 /')"
    if [ ${#not_recorded[@]} -gt 0 ]; then
        echo "   of which not in $APT_INSTALLED_LIST (installed before the record existed, or by hand):"
        echo "     $(echo "${not_recorded[@]}" | fold -s -w 90 | sed '2,$s/^/     /')"
    fi
    local dirs=()
    for pkg in "${PURGE[@]}"; do for d in $(data_dirs_of "$pkg"); do [ -e "$d" ] && dirs+=("$d"); done; done
    echo "   rm -rf ${dirs[*]:-(no data directories)}"
    if [ ${#PURGE[@]} -gt 0 ]; then
        check_purge_plan "${PURGE[@]}"
        echo "   apt-get -s purge: removes exactly these packages, nothing the machine came with"
        echo "   processes now running their binaries (each must be gone after step 1):"
        processes_of "${PURGE[@]}" | while read -r pid exe pkg; do
            printf '     %-7s %-48s %-24s %s\n' "$pid" "$exe" "$pkg" "$(fate "$pid")"
        done
    fi
    [ -z "${FRESH_CACHES:-}" ] || echo "   apt-get clean"
    echo
    echo "3. from a clean clone of $COMMIT, with a new TASKHERD_HOME and services directory:"
    echo "   git clone $REPO_ROOT $REHEARSAL/clone"
    echo "   make test"
    echo "   make demo DEMO_SHORT=1"
    if [ -n "${FRESH_CACHES:-}" ]; then
        echo "   caches: new and empty (GOMODCACHE, GOCACHE, PIP_CACHE_DIR in $REHEARSAL/caches)"
    else
        echo "   caches reused: Go modules $(go_cache GOMODCACHE), Go builds $(go_cache GOCACHE), pip ~/.cache/pip, apt /var/cache/apt/archives (FRESH_CACHES=1 empties them)"
    fi
    echo
    if [ -n "${FRESH_KEEP:-}" ]; then
        echo "4. leave the rehearsal's cluster and services running (FRESH_KEEP=1)"
    else
        echo "4. stop the rehearsal's cluster and services; start again what ran before (the cluster of ${CLUSTER_HOMES[*]:-none}, the services of ${SERVICES_DIRS[*]:-none})"
    fi
}
go_cache() { local v; v=$( (PATH=/usr/local/go/bin:$PATH; go env "$1") 2>/dev/null) || v=unknown; echo "${v:-unknown}"; }

plan | tee "$REHEARSAL/plan.txt"
BLOCKERS=$(foreign_blockers)
if [ -n "$BLOCKERS" ]; then
    echo
    echo "These processes were not started by the project's scripts (so the rehearsal would not stop them),"
    echo "yet they hold a service port or run a binary of a package to purge:"
    printf '%s\n' "$BLOCKERS" | sed 's/^/   /'
    die "refusing to run: stop them first (by their PIDs), then run it again. Nothing was changed."
fi
if [ -n "$DRY_RUN" ]; then
    echo
    echo "DRY_RUN: nothing was changed (the plan is in $REHEARSAL/plan.txt)."
    exit 0
fi
if [ "${TASKHERD_FRESH_CONFIRM:-}" != yes ]; then
    echo
    die "refusing to run: it stops the services and the cluster others on this machine may be using, and purges
    packages. Nothing was changed. Run it with TASKHERD_FRESH_CONFIRM=yes (or DRY_RUN=1 for the plan only)."
fi

# ---- the run ------------------------------------------------------------------------------------------
export TASKHERD_STEPS_FILE="$REHEARSAL/steps-rehearsal.tsv"
: >"$TASKHERD_STEPS_FILE"
stamp() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do printf '%(%H:%M:%S)T %s\n' -1 "$line"; done
}
# phase NAME COMMAND...: output on the terminal and, time-stamped, in logs/NAME.log; recorded with
# its time. COMMAND is written not to rely on errexit (it runs behind `||`).
phase() {
    local name=$1 t0=$SECONDS rc=0
    shift
    log "── $name"
    { "$@" 2>&1 || exit $?; } | tee >(stamp >"$REHEARSAL/logs/$name.log") || rc=$?
    local outcome=passed
    [ "$rc" -eq 0 ] || outcome=failed
    step_done "$name" "$outcome" $((SECONDS - t0)) "log: logs/$name.log" "$rc"
    [ "$rc" -eq 0 ] || log "$name FAILED (exit status $rc; log: $REHEARSAL/logs/$name.log)"
    return "$rc"
}

stop_what_runs() {
    local h d f rc=0
    for h in $(candidate_homes); do
        for f in $(live_pids_in "$h"/demo/forward-*.pid | cut -d' ' -f2); do
            # socat forks one child per connection in its own session: end the session's group
            kill -TERM -- "-$(pidfile_pid "$f")" 2>/dev/null && log "stopped the demo forwarder of $f"
            rm -f "$f"
        done
    done
    for h in "${CLUSTER_HOMES[@]}"; do
        TASKHERD_HOME=$h bash "$REPO_ROOT/e2e/cluster/down.sh" || rc=1
    done
    for f in $(private_dockerds | cut -d' ' -f2); do  # dockerd stops its containers and its containerd
        stop_pidfile dockerd "$f" 60 "$(readlink -f "$(command -v dockerd)")"
    done
    for d in "${SERVICES_DIRS[@]}"; do
        TASKHERD_SERVICES_DIR=$d bash "$REPO_ROOT/scripts/services.sh" down || rc=1
    done
    local epmd=/usr/bin/epmd
    [ -x "$epmd" ] && "$epmd" -names >/dev/null 2>&1 && { "$epmd" -kill || rc=1; }
    local port
    for port in $(service_ports); do
        if port_in_use "$port"; then
            log "port $port is still in use by a process the project's scripts did not start:"
            ss -Hltnp "sport = :$port"
            rc=1
        fi
    done
    return "$rc"
}

purge_packages() {
    [ ${#PURGE[@]} -gt 0 ] || { log "nothing to purge"; return 0; }
    local left
    left=$(processes_of "${PURGE[@]}")
    if [ -n "$left" ]; then
        log "these processes still run binaries of packages to purge (not started by the project's scripts?):"
        echo "$left"
        return 1
    fi
    check_purge_plan "${PURGE[@]}" || return 1
    mkdir -p "$APT_STATE_DIR"
    printf '%s\n' "${PURGE[@]}" >"$REHEARSAL/purged-packages.txt"
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "${PURGE[@]}" || return 1
    local pkg d
    for pkg in "${PURGE[@]}"; do
        for d in $(data_dirs_of "$pkg"); do
            [ -e "$d" ] && { rm -rf --one-file-system "$d" && echo "removed $d"; }
        done
    done
    # what is still installed stays recorded; the rehearsal's own installs record the rest again
    if [ -f "$APT_INSTALLED_LIST" ]; then
        dpkg_installed | LC_ALL=C comm -12 - <(LC_ALL=C sort -u "$APT_INSTALLED_LIST") >"$APT_INSTALLED_LIST.new"
        mv "$APT_INSTALLED_LIST.new" "$APT_INSTALLED_LIST"
    fi
    if [ -n "${FRESH_CACHES:-}" ]; then apt-get clean; fi
}

# The inner runs see none of the caller's taskherd, make or kubeconfig settings.
INNER_ENV=(env)
for v in $(compgen -e); do
    case "$v" in
    TASKHERD_* | KUBECONFIG | MAKEFLAGS | MFLAGS | MAKELEVEL | MAKEOVERRIDES | GNUMAKEFLAGS | DEMO_SHORT | BROKER | PYTEST_ARGS)
        INNER_ENV+=(-u "$v") ;;
    esac
done
INNER_ENV+=("TASKHERD_HOME=$REHEARSAL/home" "TASKHERD_SERVICES_DIR=$REHEARSAL/services")
if [ -n "${FRESH_CACHES:-}" ]; then
    INNER_ENV+=("GOMODCACHE=$REHEARSAL/caches/gomod" "GOCACHE=$REHEARSAL/caches/go-build" "PIP_CACHE_DIR=$REHEARSAL/caches/pip")
fi
inner_make() {  # STEPS_NAME ARGS...: make in the clone, as a newcomer would type it
    local steps=$1
    shift
    (cd "$REHEARSAL/clone" && "${INNER_ENV[@]}" "TASKHERD_STEPS_FILE=$REHEARSAL/steps-$steps.tsv" make "$@")
}
clone() {
    git clone -q "$REPO_ROOT" "$REHEARSAL/clone" && git -C "$REHEARSAL/clone" checkout -q --detach "$COMMIT" &&
        git -C "$REHEARSAL/clone" log -1 --format='%H %s'
}
stop_rehearsal() {
    local rc=0
    (cd "$REHEARSAL/clone" && "${INNER_ENV[@]}" bash e2e/cluster/down.sh) || rc=1
    (cd "$REHEARSAL/clone" && "${INNER_ENV[@]}" bash scripts/services.sh down) || rc=1
    return "$rc"
}
start_previous() {  # the services and the cluster that ran before, from this checkout's scripts
    local h d rc=0
    for d in "${SERVICES_DIRS[@]}"; do
        TASKHERD_SERVICES_DIR=$d TASKHERD_STEPS_FILE='' bash "$REPO_ROOT/scripts/services.sh" up || rc=1
    done
    for h in "${CLUSTER_HOMES[@]}"; do
        TASKHERD_HOME=$h TASKHERD_STEPS_FILE='' bash "$REPO_ROOT/e2e/cluster/up.sh" || rc=1
    done
    return "$rc"
}
restore() {
    local rc=0
    stop_rehearsal || rc=1
    start_previous || rc=1
    return "$rc"
}
# A rehearsal that stops before its runs leaves the machine as others had it.
give_up() {
    log "ERROR: $*"
    phase start-previous start_previous || true
    exit 1
}

[ "$PRISTINE_FILE" = "$DPKG_PRISTINE_LIST" ] || {
    mkdir -p "$APT_STATE_DIR"
    LC_ALL=C sort -u "$PRISTINE_FILE" >"$DPKG_PRISTINE_LIST"
    log "seeded $DPKG_PRISTINE_LIST from $PRISTINE_FILE (once: from now on it is the machine's own list)"
}
# The machine's memory in use (MiB, machine-wide: run it when nothing else does), every 5 s.
sample_memory() {
    while kill -0 "$1" 2>/dev/null; do
        printf '%s %s\n' "$(date +%s)" "$(free -m | awk '$1 == "Mem:" {print $3}')"
        sleep 5
    done >"$REHEARSAL/memory.txt"
}
# Disk taken by the packages the rehearsal installed, in MiB (dpkg's Installed-Size).
packages_mib() {
    # shellcheck disable=SC2016  # a dpkg-query format, not a shell expansion
    dpkg_installed | LC_ALL=C comm -23 - <(LC_ALL=C sort -u "$DPKG_PRISTINE_LIST") |
        xargs -r dpkg-query -W -f='${Installed-Size}\n' | awk '{kib += $1} END {printf "%d", kib / 1024}'
}

T0=$SECONDS
failed=0
phase stop-what-runs stop_what_runs || give_up "could not stop everything (see above): nothing was purged"
phase purge-packages purge_packages || give_up "the purge failed (see above)"
phase clone clone || give_up "git clone failed"
MEMORY_BEFORE=$(free -m | awk '$1 == "Mem:" {print $3}')
sample_memory "$$" &
SAMPLER=$!
phase make-test inner_make make-test test || failed=1
phase make-demo inner_make make-demo demo DEMO_SHORT=1 || failed=1
kill "$SAMPLER" 2>/dev/null || true
MEMORY_PEAK=$(awk '$2 > max {max = $2} END {print max + 0}' "$REHEARSAL/memory.txt")
PACKAGES_MIB=$(packages_mib)
if [ -z "${FRESH_KEEP:-}" ]; then phase restore restore || failed=1; fi

{
    echo
    echo "== fresh-machine rehearsal of $COMMIT: $(fmt_duration $((SECONDS - T0))) =="
    steps_summary "$TASKHERD_STEPS_FILE" "rehearsal"
    steps_summary "$REHEARSAL/steps-make-test.tsv" "make test (first run)"
    steps_summary "$REHEARSAL/steps-make-demo.tsv" "make demo DEMO_SHORT=1 (right after)"
    echo
    echo "disk: $(du -sh "$REHEARSAL/home" 2>/dev/null | cut -f1) in TASKHERD_HOME, $(du -sh "$REHEARSAL/clone" 2>/dev/null | cut -f1) in the clone (with .venv), ${PACKAGES_MIB} MiB of Debian packages$([ -z "${FRESH_CACHES:-}" ] || echo ", $(du -sh "$REHEARSAL/caches" 2>/dev/null | cut -f1) in Go's and pip's caches")"
    echo "memory in use (machine-wide): ${MEMORY_BEFORE} MiB before the runs, ${MEMORY_PEAK} MiB at the peak (memory.txt: every 5 s)"
    echo "logs: $REHEARSAL/logs, $REHEARSAL/home/logs"
} | tee "$REHEARSAL/timings.txt"
exit "$failed"
