#!/bin/bash
# Every pod serves sshd (non-root, port 2222, host key certified by the job's CA); node rank 0 launches.
set -euo pipefail
. /shared/torch.env
mkdir -p "$HOME/.ssh"
ln -sf /shared/ssh/ssh_config "$HOME/.ssh/config"   # ssh reads ~/.ssh/config from the passwd home
/usr/sbin/sshd -f /shared/ssh/sshd_config -E /tmp/sshd.log
if [ "${NODE_RANK}" = "0" ]; then
  exec deepspeed --launcher pdsh --hostfile /shared/hostfile \
    --master_addr "${MASTER_ADDR}" --master_port "${MASTER_PORT}" "$@"
fi
exec sleep infinity
