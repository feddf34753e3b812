"""The scheduler's web dashboard: pages, and ``/metrics`` for Prometheus."""
