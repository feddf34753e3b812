"""A job queue of shell-command runs, each placed where the resources it asks for are free.

``spec`` says what a run is (argv, environment, resources, limits), ``journal`` keeps
every run durably in SQLite so that a killed scheduler loses nothing, and ``table``
renders runs for people. Those three are pure data: they start no processes.
"""
