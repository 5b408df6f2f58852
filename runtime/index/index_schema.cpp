// The index's schema: every migration's SQL text (index_database.cpp applies them).
#include "runtime/index/index_schema.h"

#include <iterator>

namespace runner::index {
namespace {

constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE runs (
  run INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL UNIQUE,
  status TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'interrupted')),
  script TEXT,
  script_hash TEXT,
  config TEXT NOT NULL DEFAULT '{}',
  summary TEXT NOT NULL DEFAULT '{}',
  git_revision TEXT,
  git_dirty INTEGER,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  device TEXT,
  seed INTEGER,
  world_size INTEGER NOT NULL DEFAULT 1,
  versions TEXT NOT NULL DEFAULT '{}',
  dir TEXT NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL,
  heartbeat_at REAL NOT NULL,
  step INTEGER NOT NULL DEFAULT 0,
  error TEXT,
  parent INTEGER REFERENCES runs (run) ON DELETE SET NULL,
  sweep INTEGER REFERENCES sweeps (sweep) ON DELETE SET NULL,
  trial INTEGER
);
CREATE INDEX runs_by_start ON runs (started_at);

CREATE TABLE metrics (
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  key TEXT NOT NULL,
  step INTEGER NOT NULL,
  value REAL,
  time REAL NOT NULL,
  PRIMARY KEY (run, key, step)
) WITHOUT ROWID;

CREATE TABLE metric_latest (
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  key TEXT NOT NULL,
  step INTEGER NOT NULL,
  value REAL,
  time REAL NOT NULL,
  PRIMARY KEY (run, key)
) WITHOUT ROWID;

CREATE TABLE checkpoints (
  checkpoint INTEGER PRIMARY KEY,
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  step INTEGER NOT NULL,
  path TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  hash TEXT NOT NULL,
  metric TEXT,
  metric_value REAL,
  kept INTEGER NOT NULL DEFAULT 1,
  created_at REAL NOT NULL,
  UNIQUE (run, path)
);

CREATE TABLE checkpoint_files (
  checkpoint INTEGER NOT NULL REFERENCES checkpoints (checkpoint) ON DELETE CASCADE,
  name TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  hash TEXT NOT NULL,
  PRIMARY KEY (checkpoint, name)
) WITHOUT ROWID;

CREATE TABLE artifacts (
  artifact INTEGER PRIMARY KEY,
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  step INTEGER NOT NULL,
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  path TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  created_at REAL NOT NULL
);
CREATE INDEX artifacts_by_run ON artifacts (run, name, step);

CREATE TABLE sweeps (
  sweep INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  script TEXT NOT NULL,
  spec TEXT NOT NULL DEFAULT '{}',
  status TEXT NOT NULL,
  created_at REAL NOT NULL
);

CREATE TABLE trials (
  sweep INTEGER NOT NULL REFERENCES sweeps (sweep) ON DELETE CASCADE,
  trial INTEGER NOT NULL,
  params TEXT NOT NULL DEFAULT '{}',
  run INTEGER REFERENCES runs (run) ON DELETE SET NULL,
  status TEXT NOT NULL,
  rung INTEGER NOT NULL DEFAULT 0,
  metric REAL,
  PRIMARY KEY (sweep, trial)
);
)sql",
     nullptr},
    // Time spent running, apart from the pauses between a stop and its resume: each attempt (the start, each
    // resume) adds its span to active_seconds when it ends; a running attempt's start is attempt_started_at.
    {2, R"sql(
ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN attempt_started_at REAL;
ALTER TABLE runs ADD COLUMN active_seconds REAL NOT NULL DEFAULT 0;
UPDATE runs SET attempt_started_at = started_at WHERE status = 'running';
UPDATE runs SET active_seconds = max(0, coalesce(ended_at, heartbeat_at) - started_at) WHERE status != 'running';
)sql",
     nullptr},
    // The hosts of a data-parallel job's ranks (a JSON array, one entry per host, in rank order).
    {3, R"sql(
ALTER TABLE runs ADD COLUMN hosts TEXT NOT NULL DEFAULT '[]';
UPDATE runs SET hosts = json_array(host);
)sql",
     nullptr},
    // Sweeps: the workers that run trials (heartbeats), how trials ended, and ASHA's rung results.
    {4, R"sql(
ALTER TABLE sweeps ADD COLUMN ended_at REAL;
ALTER TABLE sweeps ADD COLUMN error TEXT;
ALTER TABLE trials ADD COLUMN step INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trials ADD COLUMN worker TEXT;
ALTER TABLE trials ADD COLUMN heartbeat_at REAL;
ALTER TABLE trials ADD COLUMN error TEXT;
ALTER TABLE trials ADD COLUMN segments INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trials ADD COLUMN created_at REAL;
ALTER TABLE trials ADD COLUMN ended_at REAL;
CREATE TABLE trial_rungs (
  sweep INTEGER NOT NULL,
  trial INTEGER NOT NULL,
  rung INTEGER NOT NULL,
  step INTEGER NOT NULL,
  value REAL,
  PRIMARY KEY (sweep, trial, rung),
  FOREIGN KEY (sweep, trial) REFERENCES trials (sweep, trial) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX runs_by_trial ON runs (sweep, trial);
)sql",
     nullptr},
    // One row per attempt of a run (its start, each resume): what it ran with, the steps it ran and how it ended.
    // A run that stops running ends its latest attempt the same way (the trigger). The runs of older indexes get
    // a row for their latest attempt, with NULL where the index kept no value.
    {6, R"sql(
CREATE TABLE attempts (
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  attempt INTEGER NOT NULL,
  status TEXT NOT NULL,
  config TEXT NOT NULL DEFAULT '{}',
  world_size INTEGER NOT NULL DEFAULT 1,
  hosts TEXT NOT NULL DEFAULT '[]',
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  device TEXT,
  seed INTEGER,
  script_hash TEXT,
  git_revision TEXT,
  git_dirty INTEGER,
  versions TEXT NOT NULL DEFAULT '{}',
  start_step INTEGER,
  end_step INTEGER,
  started_at REAL,
  ended_at REAL,
  error TEXT,
  PRIMARY KEY (run, attempt)
) WITHOUT ROWID;
INSERT INTO attempts (run, attempt, status, config, world_size, hosts, host, pid, device, seed, script_hash,
                      git_revision, git_dirty, versions, start_step, end_step, started_at, ended_at, error)
SELECT run, attempts, status, config, world_size, hosts, host, pid, device, seed, script_hash, git_revision, git_dirty,
       versions, CASE WHEN attempts = 1 AND parent IS NULL THEN 0 END, step,
       CASE WHEN attempts = 1 THEN started_at ELSE attempt_started_at END, ended_at, error
FROM runs;
CREATE TRIGGER attempt_ends_with_its_run AFTER UPDATE OF status ON runs WHEN NEW.status != 'running'
BEGIN
  UPDATE attempts SET status = NEW.status, error = NEW.error, ended_at = NEW.ended_at
  WHERE run = NEW.run AND attempt = NEW.attempts;
END;
)sql",
     nullptr},
    // Sweeps: each sweep's live workers (so a running sweep whose workers all died shows so), and the retries
    // of trials that a signal killed.
    {7, R"sql(
CREATE TABLE sweep_workers (
  sweep INTEGER NOT NULL REFERENCES sweeps (sweep) ON DELETE CASCADE,
  worker TEXT NOT NULL,
  started_at REAL NOT NULL,
  heartbeat_at REAL NOT NULL,
  PRIMARY KEY (sweep, worker)
) WITHOUT ROWID;
ALTER TABLE trials ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
)sql",
     nullptr},
    // Runs of ASHA trials: `paused` at a rung (waiting for a promotion), `pruned` when the sweep ended them there
    // (they were `interrupted`, like killed runs). SQLite cannot alter a CHECK constraint: the runs table's
    // definition is rewritten in place (it only widens the constraint, which every row already meets), and the
    // new index changes the schema cookie, so other connections read the new definition. ASHA's rungs count from 1.
    // The last number given to each script's run names, so that a removed run's name is not given again.
    // What each attempt read (its data and VAE), as resolved, with what identifies them.
    // An index on PostgreSQL starts here: its text creates every table as SQLite's migrations 1 to 8 leave them.
    {8, R"sql(
PRAGMA writable_schema = ON;
UPDATE sqlite_master SET sql = replace(sql, '''failed'', ''interrupted'')', '''failed'', ''interrupted'', ''paused'', ''pruned'')')
WHERE type = 'table' AND name = 'runs';
PRAGMA writable_schema = RESET;
CREATE INDEX trials_by_run ON trials (run);
UPDATE runs SET status = 'paused' WHERE status = 'interrupted' AND run IN (SELECT run FROM trials WHERE status = 'paused');
UPDATE runs SET status = 'pruned' WHERE status = 'interrupted' AND run IN (SELECT run FROM trials WHERE status = 'pruned');
UPDATE trial_rungs SET rung = -rung - 1;
UPDATE trial_rungs SET rung = -rung;
CREATE TABLE run_name_numbers (
  stem TEXT PRIMARY KEY,
  last INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE inputs (
  run INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  kind TEXT NOT NULL,
  path TEXT NOT NULL,
  bytes INTEGER,
  modified_at REAL,
  detail TEXT NOT NULL DEFAULT '{}',
  recorded_at REAL NOT NULL,
  PRIMARY KEY (run, attempt, kind, path),
  FOREIGN KEY (run, attempt) REFERENCES attempts (run, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
)sql",
     R"sql(
CREATE TABLE sweeps (
  sweep BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  script TEXT NOT NULL,
  spec TEXT NOT NULL DEFAULT '{}',
  status TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL,
  ended_at DOUBLE PRECISION,
  error TEXT
);

CREATE TABLE runs (
  run BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL UNIQUE,
  status TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'interrupted', 'paused', 'pruned')),
  script TEXT,
  script_hash TEXT,
  config TEXT NOT NULL DEFAULT '{}',
  summary TEXT NOT NULL DEFAULT '{}',
  git_revision TEXT,
  git_dirty BIGINT,
  host TEXT NOT NULL,
  pid BIGINT NOT NULL,
  device TEXT,
  seed BIGINT,
  world_size BIGINT NOT NULL DEFAULT 1,
  versions TEXT NOT NULL DEFAULT '{}',
  dir TEXT NOT NULL,
  started_at DOUBLE PRECISION NOT NULL,
  ended_at DOUBLE PRECISION,
  heartbeat_at DOUBLE PRECISION NOT NULL,
  step BIGINT NOT NULL DEFAULT 0,
  error TEXT,
  parent BIGINT REFERENCES runs (run) ON DELETE SET NULL,
  sweep BIGINT REFERENCES sweeps (sweep) ON DELETE SET NULL,
  trial BIGINT,
  attempts BIGINT NOT NULL DEFAULT 1,
  attempt_started_at DOUBLE PRECISION,
  active_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
  hosts TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX runs_by_start ON runs (started_at);
CREATE INDEX runs_by_trial ON runs (sweep, trial);

CREATE TABLE metrics (
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  key TEXT NOT NULL,
  step BIGINT NOT NULL,
  value DOUBLE PRECISION,
  time DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (run, key, step)
);

CREATE TABLE metric_latest (
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  key TEXT NOT NULL,
  step BIGINT NOT NULL,
  value DOUBLE PRECISION,
  time DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (run, key)
);

CREATE TABLE checkpoints (
  checkpoint BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  step BIGINT NOT NULL,
  path TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  hash TEXT NOT NULL,
  metric TEXT,
  metric_value DOUBLE PRECISION,
  kept BIGINT NOT NULL DEFAULT 1,
  created_at DOUBLE PRECISION NOT NULL,
  UNIQUE (run, path)
);

CREATE TABLE checkpoint_files (
  checkpoint BIGINT NOT NULL REFERENCES checkpoints (checkpoint) ON DELETE CASCADE,
  name TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  hash TEXT NOT NULL,
  PRIMARY KEY (checkpoint, name)
);

CREATE TABLE artifacts (
  artifact BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  step BIGINT NOT NULL,
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  path TEXT NOT NULL,
  bytes BIGINT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX artifacts_by_run ON artifacts (run, name, step);

CREATE TABLE trials (
  sweep BIGINT NOT NULL REFERENCES sweeps (sweep) ON DELETE CASCADE,
  trial BIGINT NOT NULL,
  params TEXT NOT NULL DEFAULT '{}',
  run BIGINT REFERENCES runs (run) ON DELETE SET NULL,
  status TEXT NOT NULL,
  rung BIGINT NOT NULL DEFAULT 0,
  metric DOUBLE PRECISION,
  step BIGINT NOT NULL DEFAULT 0,
  worker TEXT,
  heartbeat_at DOUBLE PRECISION,
  error TEXT,
  segments BIGINT NOT NULL DEFAULT 0,
  created_at DOUBLE PRECISION,
  ended_at DOUBLE PRECISION,
  retries BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (sweep, trial)
);
CREATE INDEX trials_by_run ON trials (run);

CREATE TABLE trial_rungs (
  sweep BIGINT NOT NULL,
  trial BIGINT NOT NULL,
  rung BIGINT NOT NULL,
  step BIGINT NOT NULL,
  value DOUBLE PRECISION,
  PRIMARY KEY (sweep, trial, rung),
  FOREIGN KEY (sweep, trial) REFERENCES trials (sweep, trial) ON DELETE CASCADE
);

CREATE TABLE sweep_workers (
  sweep BIGINT NOT NULL REFERENCES sweeps (sweep) ON DELETE CASCADE,
  worker TEXT NOT NULL,
  started_at DOUBLE PRECISION NOT NULL,
  heartbeat_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (sweep, worker)
);

CREATE TABLE attempts (
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  attempt BIGINT NOT NULL,
  status TEXT NOT NULL,
  config TEXT NOT NULL DEFAULT '{}',
  world_size BIGINT NOT NULL DEFAULT 1,
  hosts TEXT NOT NULL DEFAULT '[]',
  host TEXT NOT NULL,
  pid BIGINT NOT NULL,
  device TEXT,
  seed BIGINT,
  script_hash TEXT,
  git_revision TEXT,
  git_dirty BIGINT,
  versions TEXT NOT NULL DEFAULT '{}',
  start_step BIGINT,
  end_step BIGINT,
  started_at DOUBLE PRECISION,
  ended_at DOUBLE PRECISION,
  error TEXT,
  PRIMARY KEY (run, attempt)
);
CREATE FUNCTION attempt_ends_with_its_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE attempts SET status = NEW.status, error = NEW.error, ended_at = NEW.ended_at
  WHERE run = NEW.run AND attempt = NEW.attempts;
  RETURN NULL;
END;
$$;
CREATE TRIGGER attempt_ends_with_its_run AFTER UPDATE OF status ON runs FOR EACH ROW
WHEN (NEW.status != 'running') EXECUTE FUNCTION attempt_ends_with_its_run();

CREATE TABLE run_name_numbers (
  stem TEXT PRIMARY KEY,
  last BIGINT NOT NULL
);

CREATE TABLE inputs (
  run BIGINT NOT NULL,
  attempt BIGINT NOT NULL,
  kind TEXT NOT NULL,
  path TEXT NOT NULL,
  bytes BIGINT,
  modified_at DOUBLE PRECISION,
  detail TEXT NOT NULL DEFAULT '{}',
  recorded_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (run, attempt, kind, path),
  FOREIGN KEY (run, attempt) REFERENCES attempts (run, attempt) ON DELETE CASCADE
);
)sql"},
    // Where each sweep worker runs, for `runner sweep show` to list them by host: its host and process, and the
    // Slurm job (array task) it runs in.
    {9, R"sql(
ALTER TABLE sweep_workers ADD COLUMN host TEXT;
ALTER TABLE sweep_workers ADD COLUMN pid INTEGER;
ALTER TABLE sweep_workers ADD COLUMN slurm_job TEXT;
)sql",
     R"sql(
ALTER TABLE sweep_workers ADD COLUMN host TEXT;
ALTER TABLE sweep_workers ADD COLUMN pid BIGINT;
ALTER TABLE sweep_workers ADD COLUMN slurm_job TEXT;
)sql"},
    // Tags and a note on runs, set by run:tag / run:note and `runner tag` / `runner note`.
    {10, R"sql(
ALTER TABLE runs ADD COLUMN note TEXT;
CREATE TABLE run_tags (
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  tag TEXT NOT NULL,
  PRIMARY KEY (run, tag)
) WITHOUT ROWID;
CREATE INDEX run_tags_by_tag ON run_tags (tag);
)sql",
     R"sql(
ALTER TABLE runs ADD COLUMN note TEXT;
CREATE TABLE run_tags (
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  tag TEXT NOT NULL,
  PRIMARY KEY (run, tag)
);
CREATE INDEX run_tags_by_tag ON run_tags (tag);
)sql"},
    // Fencing of sweep trials (index/writer_fence.h): each claim or takeover of a trial gives it a new generation,
    // which the trial's process checks in every write transaction.
    {11, R"sql(
ALTER TABLE trials ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
)sql",
     R"sql(
ALTER TABLE trials ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
)sql"},
    // Keys that clients make for the writes they may have to retry after a lost connection (its commit's answer lost):
    // a trial's latest claim (its key, reason, pause step and the run it continues) and the latest start or resume of
    // a run, so that the retry finds what its first try did instead of doing it again.
    {12, R"sql(
ALTER TABLE trials ADD COLUMN claim TEXT;
ALTER TABLE runs ADD COLUMN start_key TEXT;
CREATE UNIQUE INDEX runs_by_start_key ON runs (start_key);
)sql",
     R"sql(
ALTER TABLE trials ADD COLUMN claim TEXT;
ALTER TABLE runs ADD COLUMN start_key TEXT;
CREATE UNIQUE INDEX runs_by_start_key ON runs (start_key);
)sql"},
    // What `runner attach` changed in a running run: each chunk that changed its state, at the step after which it
    // ran, with its text and the changes (a JSON array of text).
    {13, R"sql(
CREATE TABLE interventions (
  intervention INTEGER PRIMARY KEY,
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  step INTEGER NOT NULL,
  time REAL NOT NULL,
  chunk TEXT NOT NULL,
  changes TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX interventions_by_run ON interventions (run, step);
)sql",
     R"sql(
CREATE TABLE interventions (
  intervention BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  step BIGINT NOT NULL,
  time DOUBLE PRECISION NOT NULL,
  chunk TEXT NOT NULL,
  changes TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX interventions_by_run ON interventions (run, step);
)sql"},
    // Histograms of tensors logged with run:log: equal bins over [low, high] with their counts (a JSON array).
    {14, R"sql(
CREATE TABLE histograms (
  run INTEGER NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  key TEXT NOT NULL,
  step INTEGER NOT NULL,
  time REAL NOT NULL,
  low REAL,
  high REAL,
  counts TEXT NOT NULL DEFAULT '[]',
  nonfinite INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run, key, step)
) WITHOUT ROWID;
)sql",
     R"sql(
CREATE TABLE histograms (
  run BIGINT NOT NULL REFERENCES runs (run) ON DELETE CASCADE,
  key TEXT NOT NULL,
  step BIGINT NOT NULL,
  time DOUBLE PRECISION NOT NULL,
  low DOUBLE PRECISION,
  high DOUBLE PRECISION,
  counts TEXT NOT NULL DEFAULT '[]',
  nonfinite BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (run, key, step)
);
)sql"},
    // Trials whose latest segment failed for want of disk space (a run's exit status 75), which a worker that starts
    // later continues from their checkpoints rather than leaving them failed.
    {15, R"sql(
ALTER TABLE trials ADD COLUMN out_of_space INTEGER NOT NULL DEFAULT 0;
)sql",
     R"sql(
ALTER TABLE trials ADD COLUMN out_of_space BIGINT NOT NULL DEFAULT 0;
)sql"},
};

}  // namespace

std::span<const Migration> schema_migrations() { return kMigrations; }

int schema_version() { return kMigrations[std::size(kMigrations) - 1].version; }

}  // namespace runner::index
