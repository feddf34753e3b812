"""Started by every Python process with this folder on its ``PYTHONPATH``: profiles
each thread when ``APPORTION_BENCH_PROFILE`` is set (``benchmarks/task_profile.py``)."""

import task_profile

task_profile.start_from_environment()
