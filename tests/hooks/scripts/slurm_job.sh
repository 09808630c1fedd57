#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --requeue
# A two-node Slurm job for the remediation test: torchrun on each node through srun, one rank per
# node, elastic_train.py resuming from its last DCP checkpoint after a requeue.
# env: RANKWATCH_TEST_PYTHON, TRAIN_ARGS (the script's arguments), and rankwatch's own settings.
# All fake nodes share 127.0.0.1: one port per job and per requeue.
PORT=$((29500 + (SLURM_JOB_ID % 1000) * 10 + ${SLURM_RESTART_COUNT:-0} % 10))
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
echo "start $(date +%s) restart=${SLURM_RESTART_COUNT:-0} nodes=$SLURM_JOB_NODELIST"
srun --kill-on-bad-exit=1 bash -c "exec $RANKWATCH_TEST_PYTHON -m torch.distributed.run --nnodes=2 \
  --node-rank=\$SLURM_NODEID --nproc-per-node=1 --master-addr=127.0.0.1 --master-port=$PORT $TRAIN_ARGS"
rc=$?; exit $rc
