#!/usr/bin/env bash
# A real Slurm cluster of three fake nodes (n1, n2, n3) on this machine, for the remediation tests.
# Usage: scripts/slurm.sh start | stop | status        (needs root; installs Debian's Slurm if missing)
# All three slurmd share 127.0.0.1 on ports 17001-17003; jobs see SLURMD_NODENAME=n1..n3.
set -euo pipefail
cmd=${1:-status}

install_slurm() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  fi
  mkdir -p /etc/slurm
  cat > /etc/slurm/slurm.conf <<'CONF'
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=17001 CPUs=2 RealMemory=1000
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.1 Port=17002 CPUs=2 RealMemory=1000
NodeName=n3 NodeHostname=n3 NodeAddr=127.0.0.1 Port=17003 CPUs=2 RealMemory=1000
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

wait_for() {  # wait_for SECONDS COMMAND...
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "slurm: timed out waiting for: $*" >&2; return 1; }
    sleep 0.2
  done
}

idle3() { [ "$(sinfo -h -N -o '%T' | grep -c -E '^idle')" = 3 ]; }

start() {
  install_slurm
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
  install -d /var/spool/slurmd/n1 /var/spool/slurmd/n2 /var/spool/slurmd/n3
  [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null || runuser -u munge -- /usr/sbin/munged
  wait_for 20 munge -n
  [ -f /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null || /usr/sbin/slurmctld
  wait_for 30 bash -c "scontrol ping | grep -q UP"
  for n in n1 n2 n3; do
    [ -f "/run/slurmd-$n.pid" ] && kill -0 "$(cat "/run/slurmd-$n.pid")" 2>/dev/null || /usr/sbin/slurmd -N "$n"
  done
  for n in n1 n2 n3; do scontrol update NodeName=$n State=RESUME >/dev/null 2>&1 || true; done
  wait_for 60 idle3
  echo "slurm: up (n1 n2 n3 idle)"
}

stop() {
  for f in /run/slurmd-n1.pid /run/slurmd-n2.pid /run/slurmd-n3.pid /run/slurmctld.pid /run/munge/munged.pid; do
    if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; fi
  done
  echo "slurm: stopped"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) sinfo -N 2>/dev/null || echo "slurm: not running" ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
