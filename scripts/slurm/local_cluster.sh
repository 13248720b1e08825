#!/bin/bash
# A one-node SLURM cluster on this machine, for tests/cluster (make test-cluster): installs Debian's
# slurm-wlm and munge when missing (root), writes slurm.conf for this host (no cgroups, no systemd),
# and starts munged, slurmctld and slurmd unless they run already. Idempotent: run it as often as you like.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "local_cluster.sh: run as root (it installs packages and starts daemons)" >&2; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
host="$(hostname -s)"
conf=/etc/slurm/slurm.conf
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > "$conf.new" <<CONF
ClusterName=local
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
MpiDefault=none
JobRequeue=1
KillWait=5
MinJobAge=600
NodeName=${host} NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
changed=0
cmp -s "$conf.new" "$conf" || { mv "$conf.new" "$conf"; changed=1; }
rm -f "$conf.new"
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
if [ "$changed" = 1 ]; then  # a new configuration: restart the daemons, once they have really gone
  pkill -x slurmctld || true; pkill -x slurmd || true
  # (pgrep -x takes one name: process names are 15 characters at most, and an alternation is longer)
  for _ in $(seq 30); do pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break; sleep 1; done
fi
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 30); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    scontrol update NodeName="$host" State=RESUME 2>/dev/null || true
    echo "local SLURM cluster up: node $host, $(nproc) CPUs ($(sinfo -h -o '%P %T'))"
    exit 0
  fi
  scontrol update NodeName="$host" State=RESUME 2>/dev/null || true
  sleep 1
done
echo "local_cluster.sh: the node did not come up; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
sinfo >&2 || true
exit 1
