#!/usr/bin/env bash
# A small Slurm cluster on this one machine, for trying deploy/slurm/mesh.sbatch
# and for its test. Everything lives in one directory of its own: munged with its
# own key and socket (no clash with a system munge), slurmctld on a free port,
# the configuration, state, spool, logs and pid files. Needs root and Debian's
# slurm-wlm and munge (tools/setup.sh installs them in test mode).
#
# NODES=1 (the default): one node, this machine on 127.0.0.1. NODES=N > 1: N nodes,
# each a slurmd in a network namespace of its own with its own address on a bridge
# (10.x.y.0/24), so every node is a separate host on the network as on a real cluster
# (they share the machine's cores: each offers CPUS of them). Slurm's backfill
# scheduler wants each component of a heterogeneous job on a node of its own
# (heterogeneous_jobs.html, "Limitations"), so a job of K components needs NODES >= K.
#
#   local_cluster.sh start DIR      start it in DIR (new or empty), wait until every node is
#                                   idle, print the line `export SLURM_CONF=DIR/slurm.conf`
#   local_cluster.sh stop DIR       cancel its jobs, stop the daemons by their pid files,
#                                   remove its namespaces and bridge
#   local_cluster.sh run -- CMD...  start one in a temporary directory, run CMD with SLURM_CONF
#                                   set, always stop it and remove the directory (exit, error,
#                                   SIGINT, SIGTERM); exits with CMD's status
#
# Environment: NODES (default 1), CPUS (per node, default the machine's), OVERSUBSCRIBE (jobs
# sharing a CPU, default 4), START_TIMEOUT (seconds to wait for idle nodes, default 60),
# OWNER_PID (start: a watchdog stops the cluster once this process is gone, even after a
# SIGKILL; run watches itself), KEEP=1 (run: keep the directory).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "local_cluster: $*" >&2
  exit 2
}

free_ports() {  # N free TCP ports on this machine
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# Stops the processes in the given pid files: SIGTERM to all, then SIGKILL to any
# still there after $1 seconds.
stop_pidfiles() {
  local wait_s=$1 file pid i
  shift
  local -a pids=()
  for file in "$@"; do
    [[ -s $file ]] || continue
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for ((i = 0; i < wait_s * 10; i++)); do
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && break; pid=""; done
    [[ -z ${pid:-} ]] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "local_cluster: pid $pid ignored SIGTERM for ${wait_s} s; SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

show_logs() {
  local dir=$1 f
  for f in "$dir"/log/*.log; do
    [[ -s $f ]] || continue
    echo "---- $f (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
}

stop_cluster() {
  local dir=$1 ns i
  [[ -d $dir/run ]] || return 0
  # The watchdog goes first, unless it is the one stopping the cluster.
  if [[ -s $dir/run/watchdog.pid && $(<"$dir/run/watchdog.pid") != "$PPID" ]]; then
    kill -TERM "$(<"$dir/run/watchdog.pid")" 2>/dev/null || true
  fi
  if [[ -f $dir/slurm.conf && -s $dir/run/slurmctld.pid ]] && kill -0 "$(<"$dir/run/slurmctld.pid")" 2>/dev/null; then
    # Jobs first, so that no slurmstepd outlives its slurmd.
    export SLURM_CONF=$dir/slurm.conf
    timeout 10 scancel --quiet --full --user=root 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      [[ -z $(timeout 5 squeue --noheader --format=%i 2>/dev/null | head -c1) ]] && break
      sleep 0.1
    done
  fi
  stop_pidfiles 15 "$dir"/run/slurmd-*.pid
  stop_pidfiles 15 "$dir/run/slurmctld.pid"
  stop_pidfiles 5 "$dir/run/munged.pid"
  # The namespaces (their veth ends go with them), then the bridge.
  if [[ -s $dir/net/namespaces ]]; then
    while read -r ns; do
      ip netns del "$ns" 2>/dev/null || true
    done <"$dir/net/namespaces"
  fi
  if [[ -s $dir/net/bridge ]]; then
    ip link del "$(<"$dir/net/bridge")" 2>/dev/null || true
  fi
  rm -f "$dir/net/namespaces" "$dir/net/bridge"
}

# A /24 under 10.0.0.0/8 that no route or address of this machine touches yet.
free_subnet() {
  local seen a b
  seen=$(ip -4 route show table all 2>/dev/null; ip -4 addr show 2>/dev/null)
  for _ in $(seq 50); do
    a=$((100 + RANDOM % 100)) b=$((RANDOM % 250))
    grep -q "10\.$a\.$b\." <<<"$seen" || { echo "10.$a.$b"; return 0; }
  done
  return 1
}

CLUSTER_DIR=""  # set once start_cluster owns the directory: what a failed start tears down
SCRIPT=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

# A detached process that stops the cluster once OWNER is gone (however it ended), and
# with REMOVE=1 removes its directory too.
start_watchdog() {  # OWNER DIR
  setsid bash -c '
    while kill -0 "$1" 2>/dev/null && [[ -d $2/run ]]; do sleep 1; done
    if [[ -d $2/run ]]; then
      echo "owner $1 gone: stopping the cluster"
      "$3" stop "$2"
      [[ $4 == 1 ]] && rm -rf "$2"
    fi
  ' watchdog "$1" "$2" "$SCRIPT" "${REMOVE:-0}" </dev/null >>"$2/log/watchdog.log" 2>&1 &
  echo $! >"$2/run/watchdog.pid"
}

start_cluster() {
  local dir=$1 tool
  [[ $EUID -eq 0 ]] || die "needs root (slurmd and munged run as root here)"
  for tool in munged mungekey slurmctld slurmd sinfo python3 ip nsenter; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install slurm-wlm munge iproute2; tools/setup.sh test does)"
  done
  local nodes=${NODES:-1} cpus=${CPUS:-$(nproc)}
  [[ $nodes =~ ^[0-9]+$ && $nodes -ge 1 && $nodes -le 16 ]] || die "NODES=$nodes: expected 1 to 16"
  [[ $cpus =~ ^[0-9]+$ && $cpus -ge 1 ]] || die "CPUS=$cpus: expected a positive number"
  mkdir -p "$dir"
  [[ -z $(ls -A "$dir") ]] || die "$dir is not empty"
  dir=$(cd "$dir" && pwd)
  CLUSTER_DIR=$dir
  chmod 0700 "$dir"
  mkdir -p "$dir"/{run,log,state,spool,munge,net}
  chmod 0700 "$dir/munge"

  local host ctld_port slurmd_port ctld_addr k
  host=$(hostname -s)
  read -r ctld_port slurmd_port < <(free_ports 2)
  local -a names=() addrs=() namespaces=()
  if ((nodes == 1)); then
    names=("$host") addrs=(127.0.0.1) ctld_addr=127.0.0.1
  else
    # A bridge on this side (slurmctld's, .1); a namespace per node (.10 + k). Every slurmd
    # then has its own addresses and ports.
    local subnet tag bridge ns
    subnet=$(free_subnet) || die "found no free 10.x.y.0/24 for the nodes' bridge"
    tag=$(printf '%04x' $((RANDOM % 65536)))
    bridge=asl${tag}br
    ip link add name "$bridge" type bridge || die "cannot create bridge $bridge"
    echo "$bridge" >"$dir/net/bridge"
    ip addr add "$subnet.1/24" dev "$bridge"
    ip link set "$bridge" up
    ctld_addr=$subnet.1
    for ((k = 0; k < nodes; k++)); do
      ns=archslurm-$tag-n$k
      ip netns add "$ns" || die "cannot create network namespace $ns"
      echo "$ns" >>"$dir/net/namespaces"
      ip link add "asl${tag}h$k" type veth peer name "asl${tag}n$k"
      ip link set "asl${tag}n$k" netns "$ns"
      ip link set "asl${tag}h$k" master "$bridge" up
      ip -n "$ns" link set lo up
      ip -n "$ns" addr add "$subnet.$((10 + k))/24" dev "asl${tag}n$k"
      ip -n "$ns" link set "asl${tag}n$k" up
      names+=("n$k") addrs+=("$subnet.$((10 + k))") namespaces+=("$ns")
    done
  fi

  # munge: a key of our own, our own socket; --force because it runs as root.
  mungekey --create --keyfile="$dir/munge/munge.key" --bits=1024 >/dev/null
  munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" \
    || { show_logs "$dir"; die "munged did not start"; }

  local node_lines=""
  for ((k = 0; k < nodes; k++)); do
    mkdir -p "$dir/spool/${names[k]}"
    node_lines+="NodeName=${names[k]} NodeAddr=${addrs[k]} CPUs=$cpus State=UNKNOWN"$'\n'
  done
  cat >"$dir/slurm.conf" <<CONF
# A local cluster written by deploy/slurm/local_cluster.sh
ClusterName=archipelago-local
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups here: processes are tracked by their parentage, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No slurmdbd, so no sacct: finished jobs are written here, and slurmctld keeps them
# for MinJobAge seconds (scontrol show job).
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
MinJobAge=3600
# Heterogeneous jobs are started only by the backfill scheduler: run it every second.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=10
InactiveLimit=0
SlurmdTimeout=60
${node_lines}# FORCE:N lets up to N jobs share a CPU, so that a mesh of small processes fits on few cores.
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:${OVERSUBSCRIBE:-4}
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld || { show_logs "$dir"; die "slurmctld did not start"; }
  for ((k = 0; k < nodes; k++)); do
    if ((nodes == 1)); then
      slurmd -N "${names[k]}" || { show_logs "$dir"; die "slurmd did not start"; }
    else
      # nsenter, not `ip netns exec`: that one mounts a fresh /sys without the cgroup
      # hierarchy slurmd looks for.
      nsenter --net="/run/netns/${namespaces[k]}" slurmd -N "${names[k]}" \
        || { show_logs "$dir"; die "slurmd ${names[k]} did not start"; }
    fi
  done

  local deadline=$((SECONDS + ${START_TIMEOUT:-60})) state=""
  while ((SECONDS < deadline)); do
    state=$(timeout 5 sinfo --noheader --format='%T %D' 2>/dev/null | tr '\n' ' ' || true)
    [[ $state == "idle $nodes " ]] && break
    sleep 0.5
  done
  if [[ $state != "idle $nodes " ]]; then
    show_logs "$dir"
    die "$nodes node(s) not idle after ${START_TIMEOUT:-60} s (sinfo: '${state:-no answer}')"
  fi
  if [[ -n ${OWNER_PID:-} ]]; then
    [[ $OWNER_PID =~ ^[0-9]+$ ]] && kill -0 "$OWNER_PID" 2>/dev/null || die "OWNER_PID=$OWNER_PID: no such process"
    start_watchdog "$OWNER_PID" "$dir"
  fi
  echo "export SLURM_CONF=$dir/slurm.conf"
}

[[ $# -ge 1 ]] || usage
case $1 in
  start)
    [[ $# -eq 2 ]] || usage
    # A failed or interrupted start leaves nothing running.
    trap 'rc=$?; [[ $rc -ne 0 && -n $CLUSTER_DIR ]] && stop_cluster "$CLUSTER_DIR"; exit $rc' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    start_cluster "$2"
    ;;
  stop)
    [[ $# -eq 2 ]] || usage
    stop_cluster "$2"
    ;;
  run)
    shift
    [[ ${1:-} == -- ]] && shift
    [[ $# -ge 1 ]] || usage
    dir=$(mktemp -d /tmp/archipelago-slurm-XXXXXX)
    child=""
    cleanup() {
      # On a signal the command goes first (it may be waiting for a job), then the cluster.
      if [[ -n $child ]]; then
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
      fi
      stop_cluster "$dir"
      if [[ ${KEEP:-0} == 1 ]]; then echo "local_cluster: kept $dir" >&2; else rm -rf "$dir"; fi
    }
    trap 'rc=$?; cleanup; exit $rc' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    remove=1
    [[ ${KEEP:-0} == 1 ]] && remove=0
    OWNER_PID=$$ REMOVE=$remove start_cluster "$dir" >/dev/null
    export SLURM_CONF=$dir/slurm.conf
    # In the background, so that a signal reaches the traps at once.
    set +e
    "$@" &
    child=$!
    wait "$child"
    rc=$?
    child=""
    set -e
    exit $rc
    ;;
  *) usage ;;
esac
