#!/usr/bin/env bash
#SBATCH --job-name=apportion-gpu
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --time=10:00
#SBATCH --output=./%x-%j.out
#SBATCH --mem=1024M
#SBATCH --gres=gpu:1
exec python3 -m apportion.cli.main worker --scheduler-file /tmp/pytest-of-root/pytest-1029/popen-gw1/test_an_adaptive_cluster_asks_0/jobs/.apportion/scheduler-scheduler-dea3d7b7.json --name slurm-${SLURM_JOB_ID} --nworkers 1 --nthreads 1 --resources slurm --lifetime 540 --drain-timeout 20
