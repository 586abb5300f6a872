#!/usr/bin/env bash
# A one-node SLURM from Debian's packages (slurm-wlm, munge), for the tests that run gossip
# under a real srun: writes /etc/slurm/slurm.conf for this host, starts munged, slurmctld
# and slurmd (no systemd needed), and waits until the node is idle. Needs root. Idempotent.
set -euo pipefail
host=$(hostname -s)
# At least 4 CPUs, so a job of the README's 4 peers per machine fits on a 2-core test host
# (SlurmdParameters=config_overrides lets slurmd take the configured count over the real one).
cpus=$(( $(nproc) > 4 ? $(nproc) : 4 ))
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown munge:munge /run/munge 2>/dev/null || true
conf=$(mktemp)
cat > "$conf" <<CONF
ClusterName=gossip-ci
SlurmctldHost=${host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
SlurmdParameters=config_overrides
NodeName=${host} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
if ! cmp -s "$conf" /etc/slurm/slurm.conf; then
    # Another configuration than the running daemons': restart them on the new one.
    pkill -x slurmd || true
    pkill -x slurmctld || true
    for _ in $(seq 50); do pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break; sleep 0.2; done
    mv "$conf" /etc/slurm/slurm.conf
    chmod 644 /etc/slurm/slurm.conf
else
    rm -f "$conf"
fi
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged --force
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
        echo "slurm: node ${host} idle"
        exit 0
    fi
    sleep 1
done
echo "slurm: the node did not come up; sinfo says:" >&2
sinfo >&2 || true
tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
