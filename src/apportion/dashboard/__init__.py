"""The scheduler's web dashboard: a small HTTP server (``server``) over a pure request
parser (``http``), one-time logins (``auth``) and the dashboard's routes
(``routes``, ``events``); see ``docs/dashboard.md``. It reads the scheduler through a
``SchedulerReadout`` it is given, never the scheduler's modules."""
