"""Starting clusters on the machines users already have: Slurm and SSH."""
