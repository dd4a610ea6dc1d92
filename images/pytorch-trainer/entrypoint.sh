#!/bin/sh
# torchrun takes --nnodes, --node-rank, --nproc-per-node, --master-addr/port (or the c10d rendezvous) from the
# PET_* variables that the agent wrote; the script then sees RANK, LOCAL_RANK and WORLD_SIZE from torchrun.
set -eu
. /shared/torch.env
exec torchrun "$@"
