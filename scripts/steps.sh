#!/usr/bin/env bash
# The Makefile's door to scripts/lib.sh: setup steps with a heartbeat, and the summary of one make run.
#
#   steps.sh run NAME KEY -- COMMAND...    COMMAND with its output in $TASKHERD_HOME/logs/KEY.log and
#                                          a heartbeat; recorded as built
#   steps.sh reused NAME                   record NAME as reused (unless this run already built it)
#   steps.sh time NAME [--tee] -- COMMAND...
#                                          COMMAND with its output on the terminal (--tee: also in
#                                          $TASKHERD_HOME/logs/NAME.log, and its last line becomes the
#                                          step's detail); recorded as passed or failed, with its time
#   steps.sh with-summary TITLE -- COMMAND...
#                                          COMMAND, then the table of this run's steps; exits with
#                                          COMMAND's status. Nested calls (the demo runs `make cluster`)
#                                          print no table of their own.
#   steps.sh apt-install PKG...            apt_install: install what is missing, record what was added
set -euo pipefail
LOG_TAG=setup
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
    sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}
# shift_to_command "$@": the number of arguments before the "--" that starts COMMAND
dashes_at() {
    local i=0 a
    for a in "$@"; do
        [ "$a" = -- ] && { echo "$i"; return 0; }
        i=$((i + 1))
    done
    usage
}

time_step() {  # NAME [--tee] -- COMMAND...
    local name=$1 tee='' t0=$SECONDS rc=0 detail=
    shift
    [ "$1" = --tee ] && { tee=1; shift; }
    shift  # --
    if [ -n "$tee" ]; then
        local logf="$TASKHERD_HOME/logs/$name.log"
        mkdir -p "${logf%/*}"
        PYTHONUNBUFFERED=1 "$@" 2>&1 | tee "$logf" || rc=$?
        detail=$(grep -v '^[[:space:]]*$' "$logf" | tail -n 1 | tr '\t' ' ' | cut -c1-160)
    else
        "$@" || rc=$?
    fi
    local outcome=passed
    [ "$rc" -eq 0 ] || outcome=failed
    step_done "$name" "$outcome" $((SECONDS - t0)) "$detail" "$rc"
    return "$rc"
}

with_summary() {  # TITLE -- COMMAND...
    local title=$1 rc=0 started
    started=$(date +%s)
    shift 2
    if [ -n "${TASKHERD_SUMMARY_OWNER:-}" ]; then
        exec "$@"
    fi
    export TASKHERD_SUMMARY_OWNER=$$
    "$@" || rc=$?
    local file=${TASKHERD_STEPS_FILE:-} tests_rc=
    if [ -s "$file" ]; then
        steps_summary "$file" "$title" "$started"
        # The test run's own closing line (pytest's) stays the last line of the output, and its exit
        # status is the run's (make itself would turn any failure into 2).
        awk -F'\t' '$1 == "tests" && $5 != "" {line = $5} END {if (line != "") print "\n" line}' "$file"
        tests_rc=$(awk -F'\t' '$1 == "tests" {rc = $6} END {print rc}' "$file")
    fi
    if [ "$rc" -ne 0 ]; then
        [ -z "$tests_rc" ] || [ "$tests_rc" -eq 0 ] || rc=$tests_rc
        log "$title failed (exit status $rc)"
    fi
    return "$rc"
}

[ $# -ge 1 ] || usage
command=$1
shift
case "$command" in
run)
    n=$(dashes_at "$@")
    [ "$n" -eq 2 ] || usage
    name=$1 key=$2
    shift 3
    run_step "$name" "$key" "$@"
    ;;
reused) [ $# -eq 1 ] || usage; step_done "$1" reused 0 ;;
time) dashes_at "$@" >/dev/null; time_step "$@" ;;
with-summary)
    [ "$(dashes_at "$@")" -eq 1 ] || usage
    with_summary "$@"
    ;;
apt-install) [ $# -ge 1 ] || usage; apt_install "$@" ;;
*) usage ;;
esac
