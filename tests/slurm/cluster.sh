#!/usr/bin/env bash
# A SLURM cluster on this machine, for the tests in tests/slurm and for trying
# `adalora sweep --launcher slurm` by hand: one slurmctld and two slurmd, nodes node1 and
# node2 of one host (Debian's slurmd is built with multiple-slurmd support: `slurmd -N`),
# so that a two-node job can be tried too. Everything it writes (slurm.conf, the munge
# key, state, logs, pid files) lives in one folder; nothing under /etc is changed.
#
#   tests/slurm/cluster.sh start DIR    install slurm-wlm and munge if missing, start
#                                       munged, slurmctld and slurmd; prints the env to use
#   tests/slurm/cluster.sh stop DIR     stop the daemons started in DIR (by their pid files)
#   tests/slurm/cluster.sh test [ARGS]  start in a fresh folder, run pytest -m slurm ARGS
#                                       against it, and stop every daemon whatever happens
#
# Needs root (slurmd runs jobs as their user, munged and slurmctld as root here) and
# apt-get. The cluster has no accounting (sacct refuses), as many small clusters do.
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PORT_BASE=${SLURM_TEST_PORT:-16817}   # slurmctld; the two slurmd take the next two
NODES="node1 node2"

skip_reason() {
    if [ "$(id -u)" != 0 ]; then
        echo "not root: the test cluster's daemons (slurmctld, slurmd, munged) run as root"
    elif ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        command -v apt-get >/dev/null || echo "no apt-get to install slurm-wlm and munge"
    fi
}

install() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null && return 0
    echo "installing slurm-wlm and munge with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends slurm-wlm munge >/dev/null
}

write_conf() {
    local dir=$1 host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
    mkdir -p "$dir/state" "$dir/munge"
    chmod 700 "$dir/munge"
    # munged refuses a key that others may read
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    cat > "$dir/slurm.conf" <<EOF
ClusterName=adalora-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT_BASE
SlurmUser=root
AuthType=auth/munge
# a requeued job may start again once its credential expired: 10 s here, 120 by default
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
MpiDefault=none
MailProg=/bin/true
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
# no cgroups in a container: processes are tracked by their parent pids
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
MaxArraySize=1000
NodeName=node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_BASE + 1)) CPUs=$cpus RealMemory=$mem
NodeName=node2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_BASE + 2)) CPUs=$cpus RealMemory=$mem
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
}

env_lines() {
    echo "export SLURM_CONF=$1/slurm.conf"
}

start() {
    local dir=$1
    install || { echo "apt-get could not install slurm-wlm and munge"; return 1; }
    write_conf "$dir"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
        --seed-file="$dir/munge/munge.seed" || return 1
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -i || return 1
    for node in $NODES; do slurmd -N "$node" || return 1; done
    # the nodes take a moment to register; the tests want both idle before they submit
    for _ in $(seq 60); do
        [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)" = 2 ] && { env_lines "$dir"; return 0; }
        sleep 1
    done
    echo "the test cluster's nodes did not come up; see the logs in $dir"
    return 1
}

stop() {
    local dir=$1 name pid
    for name in slurmd-node1 slurmd-node2 slurmctld munged; do
        pid=$(cat "$dir/$name.pid" 2>/dev/null) || continue
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null
    done
    # job steps outlive slurmd when it is stopped mid-job: end what our jobs left running
    for pid in $(pgrep -f "slurmstepd: \[" 2>/dev/null); do
        grep -qs "$dir" "/proc/$pid/cmdline" "/proc/$pid/environ" && kill -9 "$pid"
    done
    return 0
}

case "${1:-}" in
    start) [ -n "${2:-}" ] || { echo "usage: $0 start DIR"; exit 2; }
           mkdir -p "$2" && start "$(cd "$2" && pwd)" ;;
    stop)  [ -n "${2:-}" ] || { echo "usage: $0 stop DIR"; exit 2; }
           stop "$(cd "$2" && pwd)" ;;
    test)
        shift
        reason=$(skip_reason)
        if [ -n "$reason" ]; then echo "make test-slurm skipped: $reason"; exit 0; fi
        dir=$(mktemp -d /tmp/adalora-slurm.XXXXXX)
        chmod 755 "$dir"
        trap 'stop "$dir"; rm -rf "$dir"' EXIT
        trap 'exit 130' INT TERM
        start "$dir" >/dev/null || { cat "$dir"/*.log 2>/dev/null | tail -20; exit 1; }
        export SLURM_CONF=$dir/slurm.conf
        cd "$ROOT" && HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "${PYTHON:-.venv/bin/python}" \
            -m pytest -q -m slurm tests/slurm "$@"
        ;;
    *) echo "usage: $0 start DIR | stop DIR | test [pytest args]"; exit 2 ;;
esac
