"""Running apportion clusters inside the allocations of batch systems (Slurm, ...)."""
