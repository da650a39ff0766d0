"""Running a study: one coordinator, one writer, runs on executors.

`coordinator` (`run_benchmark`: lock the folder, start or resume it, run what is left, write
the report), `folder` (StudyFolder: the folder's files), `recorder` (the one writer: runs'
messages written in run order), `executors` (where runs execute: this process, local
workers, a Ray cluster), `worker` (one run, as messages), `evaluate` (every model alone on
held-out queries), `progress` (runs done, running, waiting, and the time left) and
`mechanism` (the folder's mechanism.json).
"""
