#!/usr/bin/env bash
# Start a real Slurm cluster on this one machine (for CI and for trying the Slurm profile).
#
# Usage: scripts/slurm/start.sh [STATE_DIR]        (as root, with the Debian packages listed in
#        scripts/apt-packages.txt: slurm-wlm slurmctld slurmd slurmdbd slurm-client munge ...)
#
# Starts munged (unless one already answers), a MariaDB server and slurmdbd (job accounting:
# sacct, sacctmgr), slurmctld and one slurmd per node directly (no systemd), with slurm.conf,
# slurmdbd.conf and gres.conf generated for this host in STATE_DIR/etc. Every node declares fake
# GPUs as GRES (character devices /dev/fakegpuN: jobs asking --gpus get CUDA_VISIBLE_DEVICES but
# no CUDA) and the feature `fakegpu` (for --constraint). Partitions: cpu (default) and gpu, both
# on every node. Accounting is enforced as on a production cluster: jobs need an account and a
# QoS the database knows. The database holds the cluster `foldmill`, the account `mylab` (the
# example of profiles/README.md) and the QoS `normal` and `high`, both allowed to root and to the
# user who ran sudo. A job using more memory than it asked for is killed.
# With FOLDMILL_SLURM_NODES > 1 the nodes are virtual (<host>-1, <host>-2, ...: several slurmd on
# this host, each on its own port), so multi-node jobs (srun across nodes) can be tested here.
# /etc/slurm/slurm.conf becomes a link to STATE_DIR/etc/slurm.conf (job steps look there), so one
# such cluster runs per machine; a configuration foldmill did not generate is never replaced. The
# fake devices stay (twins of /dev/null) for the next start. Idempotent: daemons already running
# from STATE_DIR are kept. Each daemon started has its PID in STATE_DIR/run/;
# scripts/slurm/stop.sh stops exactly those and removes the link.
#
# Environment: FOLDMILL_SLURM_NODES (default 1), FOLDMILL_SLURM_GPUS (fake GPUs per node,
# default 2), FOLDMILL_SLURM_PORT (slurmctld port, default 6817; the slurmd ports follow it, then
# slurmdbd's and MariaDB's, on 127.0.0.1).
set -euo pipefail

state_dir="$(realpath -m "${1:-${FOLDMILL_SLURM_DIR:-/tmp/foldmill-slurm}}")"
n_nodes="${FOLDMILL_SLURM_NODES:-1}"
n_gpus="${FOLDMILL_SLURM_GPUS:-2}"
ctld_port="${FOLDMILL_SLURM_PORT:-6817}"

die() { echo "slurm/start: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (slurmd runs jobs as their users; fake GPUs need mknod)"
for tool in munged munge unmunge slurmctld slurmd slurmdbd sacctmgr mariadbd mariadb-install-db mariadb sinfo scontrol; do
    command -v "$tool" >/dev/null || die "'$tool' not found: install the Debian packages in scripts/apt-packages.txt (scripts/setup.sh)"
done
[[ "$n_nodes" =~ ^[1-9][0-9]*$ && "$n_gpus" =~ ^[0-9]+$ ]] || die "FOLDMILL_SLURM_NODES must be >= 1 and FOLDMILL_SLURM_GPUS >= 0"

conf="$state_dir/etc/slurm.conf"
run="$state_dir/run"
export SLURM_CONF="$conf"
dbd_port=$((ctld_port + n_nodes + 1))
db_port=$((ctld_port + n_nodes + 2))

alive() {  # alive PIDFILE NAME: the PID in PIDFILE is a live (not zombie) process called NAME
    local pid
    pid="$(cat "$1" 2>/dev/null)" && [ -n "$pid" ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

wait_alive() {  # wait_alive PIDFILE NAME: daemons write their PID file just after forking
    for _ in $(seq 100); do alive "$1" "$2" && return 0; sleep 0.1; done
    return 1
}

mkdir -p "$state_dir/etc" "$run" "$state_dir/log" "$state_dir/spool"
chmod 755 "$state_dir" "$state_dir/etc" "$run" "$state_dir/log" "$state_dir/spool"

# --- munge: authentication of every Slurm message --------------------------------------------
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "slurm/start: munged already answers; using it"
else
    [ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing (reinstall the munge package)"
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged
    # munged writes its PID file as the munge user; keep a copy beside the other daemons' PIDs.
    for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$run/munged.pid"
    munge -n | unmunge >/dev/null || die "munged started but 'munge -n | unmunge' fails (see /var/log/munge/munged.log)"
    echo "slurm/start: started munged (pid $(cat "$run/munged.pid"))"
fi

# --- configuration for this host -------------------------------------------------------------
host="$(hostname -s)"
slurm_user=slurm
id -u "$slurm_user" >/dev/null 2>&1 || slurm_user=root
# --- accounting: MariaDB and slurmdbd, before slurmctld (which registers with slurmdbd) --------
db_dir="$state_dir/mariadb"
db_run="$state_dir/mariadb-run"  # MariaDB writes its socket and PID file as the mysql user
db_socket="$db_run/mariadbd.sock"
sql() { mariadb --protocol=socket --socket="$db_socket" -u root -N -B -e "$1"; }
if alive "$run/mariadbd.pid" mariadbd; then
    echo "slurm/start: MariaDB already running from $state_dir"
else
    install -d -o mysql -g mysql -m 0755 "$db_run"
    if [ ! -d "$db_dir/mysql" ]; then
        install -d -o mysql -g mysql -m 0700 "$db_dir"
        mariadb-install-db --user=mysql --datadir="$db_dir" --auth-root-authentication-method=socket \
            --skip-test-db >"$state_dir/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed (see $state_dir/log/mariadb-install.log)"
    fi
    rm -f "$db_run/mariadbd.pid"
    # --no-defaults: nothing from the system's MariaDB configuration; TCP only on 127.0.0.1.
    setsid mariadbd --no-defaults --user=mysql --datadir="$db_dir" --socket="$db_socket" \
        --pid-file="$db_run/mariadbd.pid" --bind-address=127.0.0.1 --port="$db_port" \
        --log-error="$state_dir/log/mariadb.log" --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
    for _ in $(seq 300); do [ -s "$db_run/mariadbd.pid" ] && sql "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
    cp "$db_run/mariadbd.pid" "$run/mariadbd.pid" 2>/dev/null
    alive "$run/mariadbd.pid" mariadbd && sql "SELECT 1" >/dev/null 2>&1 ||
        die "MariaDB did not start (see $state_dir/log/mariadb.log)"
    echo "slurm/start: started MariaDB (pid $(cat "$run/mariadbd.pid"))"
fi
# slurmdbd's database user; its password lives only in slurmdbd.conf (mode 600).
db_pass_file="$state_dir/etc/slurmdbd.pass"
[ -s "$db_pass_file" ] || (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$db_pass_file")
db_pass="$(cat "$db_pass_file")"
sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
     ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
     CREATE DATABASE IF NOT EXISTS slurm_acct_db;
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "cannot create slurmdbd's database user"

# `slurmd -C` prints this machine's real topology and memory: declaring exactly that keeps a node
# from being drained for "low socket*core*thread count" or "low RealMemory".
node_line="$(slurmd -C | head -1)"
case "$node_line" in NodeName=*) ;; *) die "'slurmd -C' printed no NodeName line: $node_line" ;; esac
hardware="${node_line#NodeName=* }"

dbd_conf="$state_dir/etc/slurmdbd.conf"
(umask 077; cat >"$dbd_conf" <<EOF
# Generated by foldmill scripts/slurm/start.sh for host $host
AuthType=auth/munge
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=$slurm_user
PidFile=$run/slurmdbd.pid
LogFile=$state_dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
EOF
)
chown "$slurm_user" "$dbd_conf"
touch "$state_dir/log/slurmdbd.log" && chown "$slurm_user" "$state_dir/log/slurmdbd.log"
if alive "$run/slurmdbd.pid" slurmdbd; then
    echo "slurm/start: slurmdbd already running from $state_dir"
else
    # slurmdbd reads the slurmdbd.conf beside $SLURM_CONF.
    slurmdbd && wait_alive "$run/slurmdbd.pid" slurmdbd || die "slurmdbd did not start (see $state_dir/log/slurmdbd.log)"
    echo "slurm/start: started slurmdbd (pid $(cat "$run/slurmdbd.pid"))"
fi

if [ "$n_nodes" -eq 1 ]; then
    nodes=("$host")
    node_list="$host"
else
    nodes=()
    for ((n = 1; n <= n_nodes; n++)); do nodes+=("$host-$n"); done
    node_list="$host-[1-$n_nodes]"
fi

node_lines=""
gres_lines="AutoDetect=off"
for ((n = 0; n < n_nodes; n++)); do
    gres=""
    if [ "$n_gpus" -gt 0 ]; then
        first=$((n * n_gpus))
        last=$((first + n_gpus - 1))
        for ((i = first; i <= last; i++)); do
            # GRES without a File= device makes slurmd report fewer GPUs than configured: the node drains.
            [ -c "/dev/fakegpu$i" ] || mknod -m 666 "/dev/fakegpu$i" c 1 3 || die "cannot create /dev/fakegpu$i (mknod not permitted?)"
        done
        gres="Gres=gpu:$n_gpus"
        gres_lines+=$'\n'"NodeName=${nodes[n]} Name=gpu File=/dev/fakegpu[$first-$last]"
    fi
    node_lines+="NodeName=${nodes[n]} NodeHostname=$host NodeAddr=127.0.0.1 Port=$((ctld_port + 1 + n)) $hardware $gres Features=fakegpu State=UNKNOWN"$'\n'
done

install -d -o "$slurm_user" -m 0755 "$state_dir/spool/slurmctld"
touch "$state_dir/log/slurmctld.log" && chown "$slurm_user" "$state_dir/log/slurmctld.log"

new_conf="$(mktemp "$state_dir/etc/slurm.conf.XXXXXX")"
cat >"$new_conf" <<EOF
# Generated by foldmill scripts/slurm/start.sh for host $host: a test cluster on one machine.
ClusterName=foldmill
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=$slurm_user
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$state_dir/spool/slurmctld
SlurmdSpoolDir=$state_dir/spool/slurmd.%n
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd.%n.pid
SlurmctldLogFile=$state_dir/log/slurmctld.log
SlurmdLogFile=$state_dir/log/slurmd.%n.log
# No systemd and cgroup v1 here: track processes without cgroups (no cgroup.conf on purpose).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
GresTypes=gpu
ReturnToService=2
MpiDefault=none
# Accounting through slurmdbd (sacct), enforced: a job's account and QoS must exist there.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
AccountingStorageEnforce=associations,limits,qos
# Memory use (the RSS summed over a step's processes, which counts pages they share, as Ray's
# processes do, more than once) sampled every second; a step above its --mem is killed, as cgroups
# would do on a production cluster (none here). RSS, not PSS: reading every process's smaps each
# second slows the jobs down on a small machine.
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/none
# Finished jobs stay visible to squeue and scontrol for an hour too (the squeue status check of the
# Snakemake Slurm plugin and the tests use it).
MinJobAge=3600
KillWait=5
InactiveLimit=0
${node_lines}PartitionName=cpu Nodes=$node_list Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$node_list MaxTime=INFINITE State=UP
EOF
chmod 644 "$new_conf"

# The cluster, account and QoS jobs use, in the accounting database (each added once).
register_accounts() {
    local answered=""
    for _ in $(seq 100); do sacctmgr -n -P list cluster >/dev/null 2>&1 && answered=1 && break; sleep 0.2; done
    [ -n "$answered" ] || die "slurmdbd does not answer sacctmgr (see $state_dir/log/slurmdbd.log)"
    has() { [ -n "$(sacctmgr -n -P list "$@" 2>/dev/null)" ]; }
    has cluster foldmill format=cluster || sacctmgr -i add cluster foldmill >/dev/null || die "sacctmgr: cannot add the cluster"
    has qos high format=name || sacctmgr -i add qos high priority=10 >/dev/null || die "sacctmgr: cannot add QoS high"
    has account mylab format=account ||
        sacctmgr -i add account mylab cluster=foldmill description="foldmill test account" organization=foldmill >/dev/null ||
        die "sacctmgr: cannot add account mylab"
    local user
    for user in root ${SUDO_USER:-}; do
        has association user="$user" account=mylab format=user ||
            sacctmgr -i add user "$user" account=mylab cluster=foldmill >/dev/null || die "sacctmgr: cannot add user $user"
        sacctmgr -i modify user "$user" set qos=normal,high defaultqos=normal >/dev/null 2>&1 || true
    done
}

daemons_alive() {
    alive "$run/slurmctld.pid" slurmctld || return 1
    for node in "${nodes[@]}"; do alive "$run/slurmd.$node.pid" slurmd || return 1; done
}

# Job steps need the configuration too, and the Snakemake Slurm plugin drops SLURM_CONF from a
# job's environment (it clears SLURM_* before its srun): link the default location to ours, as a
# real cluster would have it. Never replace a configuration foldmill did not generate.
system_conf=/etc/slurm/slurm.conf
if [ -e "$system_conf" ] && ! grep -q '^# Generated by foldmill scripts/slurm/start.sh' "$system_conf"; then
    rm -f "$new_conf"
    die "$system_conf exists and was not generated by foldmill: this machine has a Slurm of its own"
fi

if daemons_alive; then
    rm -f "$new_conf"
    echo "slurm/start: slurmctld and slurmd already running from $state_dir"
else
    mv "$new_conf" "$conf"
    mkdir -p /etc/slurm
    ln -sfn "$conf" "$system_conf"
    printf '# Generated by foldmill scripts/slurm/start.sh\n%s\n' "$gres_lines" >"$state_dir/etc/gres.conf"
    chmod 644 "$state_dir/etc/gres.conf"
    register_accounts
    if ! alive "$run/slurmctld.pid" slurmctld; then
        # -c: start from a clean job state; this cluster holds nothing worth recovering.
        slurmctld -c -f "$conf" && wait_alive "$run/slurmctld.pid" slurmctld ||
            die "slurmctld did not start (see $state_dir/log/slurmctld.log)"
        echo "slurm/start: started slurmctld (pid $(cat "$run/slurmctld.pid"))"
    fi
    for node in "${nodes[@]}"; do
        alive "$run/slurmd.$node.pid" slurmd && continue
        mkdir -p "$state_dir/spool/slurmd.$node"
        slurmd -f "$conf" -N "$node" && wait_alive "$run/slurmd.$node.pid" slurmd ||
            die "slurmd for $node did not start (see $state_dir/log/slurmd.$node.log)"
        echo "slurm/start: started slurmd for node $node (pid $(cat "$run/slurmd.$node.pid"))"
    done
fi

# --- wait until every node takes jobs ----------------------------------------------------------
ready() { [ "$(sinfo -h -N -p cpu -t idle,mixed,allocated -o %N 2>/dev/null | sort -u | wc -l)" -eq "$n_nodes" ]; }
for _ in $(seq 60); do
    ready && break
    # A node that registered before its GRES were right stays drained: resume it once it answers.
    for node in $(sinfo -h -N -t drain,down -o %N 2>/dev/null | sort -u); do
        scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
    done
    sleep 0.5
done
if ! ready; then
    tail -n 20 "$state_dir"/log/slurm*.log >&2 || true
    sinfo -N -o '%N %T %E' >&2 || true
    die "the nodes did not become idle within 30 s"
fi
echo "slurm/start: $n_nodes node(s) $node_list up with $n_gpus fake GPU(s) each; partitions cpu, gpu"
echo "export SLURM_CONF=$conf"
