"""Job logs: one numbered store per job, read by range, followed live, archived at the end.

Line numbers are 1-based and global per job. Where they come from:
- a backend that numbers its log itself (`ComputeBackend.log_file`, e.g. the local
  backend's `output.log`, rank 0): line n is the file's n-th line, read in place;
- otherwise a spool the console appends to as it reads the job's log sources (see
  `LogSpool`), so lines of several ranks get one stable order (arrival order);
- once the job has finished, an archive (gzip members plus an index of their offsets,
  under LOG_ARCHIVE_DIR) keeps the log readable, by range, after its pods (or run
  directory) are gone.

Upstream reads go through the backend's log interface only (`log_sources`, `open_log`
in jobs.backends.base), e.g. the pod log API of a Kubernetes job (one `follow=True`
stream per pod while the job is followed, a one-off read of each pod's log for an API
read nobody follows).

Only complete lines are numbered while a job runs; a last line without its newline is
added once the job has ended, so a number never changes its text. A line longer than
64 KiB is numbered as 64 KiB pieces, and a log is kept up to `JOB_LOG_MAX_BYTES`, then
ends with a line saying it was truncated (lines.py: the one rule every reader follows).
No read holds more than a bounded window: a page is at most about 1 MiB of text, a file
is scanned in 1 MiB chunks, an archive member holds about 1 MiB.

Following: while anyone watches a job, exactly one `LogFollower` (in one ASGI process)
reads new lines and publishes them in batches (every ≤ 100 ms): to `job.<id>` through
Redis while other processes have viewers of the job, straight to its own process's
sockets while they are the only ones (a single-process console then spends no Redis
round trip per batch). "Exactly one" is a Redis lease (SET NX PX, renewed every second,
released by its owner): every process with viewers of the job runs a follower loop, only
the lease holder reads, and if its process dies, another takes over within the lease
time, starting after the last line published (kept in Redis, saved every second; a
take-over may repeat up to a second of lines, which sockets drop by number). A
per-process registry alone would give one follower per process, i.e. duplicated
upstream reads (pod log streams) and duplicated batches with several web processes.
Sockets never depend on the follower for completeness: each one checks line numbers and
fills any gap from the store, so a hand-over or a dropped batch costs latency, not lines.

Secret values of the job (its secret env, including tenant secrets it references) are
masked in every line this module returns or publishes.

Rooms: lines.py (bytes to numbered lines, the cap), masking.py (secret values), stores.py
(numbered stores, the spool), archive.py (the compressed archive of a finished job),
leases.py (Redis: who follows a job), reading.py (ranges, tails, downloads), follower.py
(live following in the ASGI process).
Import from the rooms; this file holds nothing, so backends may use the stores.
"""
