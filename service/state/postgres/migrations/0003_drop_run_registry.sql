-- The run registry and the mailbox of 0001_initial.sql (tables `runs` and `mailbox`, the
-- sequence `run_fences`) were never used: live runs are shared between replicas by the
-- Redis run bus, which keeps its own claims, leases, fences and inboxes. They go, with
-- their indexes; nothing else refers to them.
DROP TABLE mailbox;
DROP TABLE runs;
DROP SEQUENCE run_fences;
