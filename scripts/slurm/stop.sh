#!/usr/bin/env bash
# Stop the Slurm cluster that scripts/slurm/start.sh started from STATE_DIR.
#
# Usage: scripts/slurm/stop.sh [STATE_DIR]
#
# Cancels the cluster's jobs, then stops exactly the daemons whose PIDs start.sh recorded in
# STATE_DIR/run/ (each slurmd, slurmctld, slurmdbd, MariaDB, and munged only if start.sh started
# it), each by PID: SIGTERM, then SIGKILL after 10 s; then removes the /etc/slurm/slurm.conf link
# start.sh made.
# Safe to run twice, or after a start that failed half-way.
set -uo pipefail

state_dir="$(realpath -m "${1:-${FOLDMILL_SLURM_DIR:-/tmp/foldmill-slurm}}")"
run="$state_dir/run"
export SLURM_CONF="$state_dir/etc/slurm.conf"

running() {  # running PID NAME: PID is a live (not zombie) process called NAME
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

pid_of() {  # pid_of PIDNAME NAME: the PID recorded in run/PIDNAME.pid, if daemon NAME still runs there
    local pid
    pid="$(cat "$run/$1.pid" 2>/dev/null)" && [ -n "$pid" ] && running "$pid" "$2" && echo "$pid"
}

stop_daemon() {  # stop_daemon PIDNAME: the daemon recorded in run/PIDNAME.pid (e.g. slurmd.node1)
    local name="${1%%.*}" pid
    if pid="$(pid_of "$1" "$name")"; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 100); do running "$pid" "$name" || break; sleep 0.1; done
        if running "$pid" "$name"; then
            kill -KILL "$pid" 2>/dev/null
            echo "slurm/stop: killed $name (pid $pid) after 10 s"
        else
            echo "slurm/stop: stopped $name (pid $pid)"
        fi
    fi
    rm -f "$run/$1.pid"
}

# Jobs first, while slurmctld and slurmd still run, so no slurmstepd is left behind.
if pid_of slurmctld slurmctld >/dev/null && [ -f "$SLURM_CONF" ]; then
    mapfile -t jobs < <(squeue -h -o %i 2>/dev/null)
    if [ "${#jobs[@]}" -gt 0 ]; then
        scancel "${jobs[@]}" 2>/dev/null
        for _ in $(seq 50); do
            [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
        echo "slurm/stop: cancelled ${#jobs[@]} job(s)"
    fi
fi

for pidfile in "$run"/slurmd.*.pid; do
    [ -e "$pidfile" ] && stop_daemon "$(basename "$pidfile" .pid)"
done
stop_daemon slurmctld
stop_daemon slurmdbd
stop_daemon mariadbd
stop_daemon munged
# The link start.sh made to this cluster's configuration.
[ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$state_dir/etc/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
exit 0
