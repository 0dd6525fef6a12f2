-- Applied at every service start; every statement is idempotent.
-- Each table is keyed so that a redelivered message rewrites its row instead of adding one.

CREATE TABLE IF NOT EXISTS pages (
    run_id           text        NOT NULL,
    url              text        NOT NULL,  -- canonical URL as published
    final_url        text        NOT NULL,  -- after redirects
    http_status      integer     NOT NULL,
    content_type     text        NOT NULL DEFAULT '',
    title            text,
    meta_description text,
    canonical_url    text,
    lang             text,
    h1               text,
    body_text        text        NOT NULL DEFAULT '',
    links            jsonb       NOT NULL DEFAULT '[]',
    queue            text        NOT NULL,
    failed_attempts  integer     NOT NULL DEFAULT 0,  -- failures before this success
    from_cache       boolean     NOT NULL DEFAULT false,
    fetch_ms         integer,
    worker_id        text        NOT NULL,
    fetched_at       timestamptz NOT NULL DEFAULT now(),
    writes           integer     NOT NULL DEFAULT 1,  -- >1 means a redelivery rewrote the row
    PRIMARY KEY (run_id, url)
);

CREATE TABLE IF NOT EXISTS dead_letters (
    id              bigserial   PRIMARY KEY,
    run_id          text        NOT NULL,
    url             text        NOT NULL,  -- 'undecodable:<sha256 of body>' when there is no URL
    reason          text        NOT NULL,  -- http_500, http_404, timeout, expired, undecodable, ...
    last_error      text        NOT NULL DEFAULT '',
    http_status     integer,
    attempts        integer     NOT NULL DEFAULT 0,
    replays         integer     NOT NULL DEFAULT 0,
    origin_queue    text        NOT NULL DEFAULT '',
    worker_id       text        NOT NULL DEFAULT '',
    body            bytea       NOT NULL,  -- the message body as received, for replay
    x_death         jsonb,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    state           text        NOT NULL DEFAULT 'dead',  -- dead | replayed
    replayed_at     timestamptz,
    UNIQUE (run_id, url)
);
CREATE INDEX IF NOT EXISTS dead_letters_reason ON dead_letters (run_id, reason);

CREATE TABLE IF NOT EXISTS skips (
    run_id      text        NOT NULL,
    url         text        NOT NULL,
    reason      text        NOT NULL,  -- robots, blocked_address, ...
    detail      text        NOT NULL DEFAULT '',
    worker_id   text        NOT NULL DEFAULT '',
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, url)
);

-- A discovery run's options (producer/discovery_scope.py's DiscoveryOptions, as JSON), written by
-- the producer beside their copy in Redis: a Redis restarted empty loses that copy, and the
-- frontier, finding none, would cut every link of the run as out of scope. It reads them here
-- then (producer/discovery_store.py).
CREATE TABLE IF NOT EXISTS run_discovery (
    run_id  text  PRIMARY KEY,
    options bytea NOT NULL
);

-- How a page was obtained: a 304 answer to a conditional request (the cached body was reused),
-- and the proxy it came through (scheme://host:port, never credentials).
ALTER TABLE pages ADD COLUMN IF NOT EXISTS not_modified boolean NOT NULL DEFAULT false;
ALTER TABLE pages ADD COLUMN IF NOT EXISTS proxy text;

-- Recrawls and extraction profiles: a hash of the visible text tells an unchanged page, and
-- the fields a profile extracted are kept beside the built-in ones.
ALTER TABLE pages ADD COLUMN IF NOT EXISTS content_hash text;
ALTER TABLE pages ADD COLUMN IF NOT EXISTS profile text;
ALTER TABLE pages ADD COLUMN IF NOT EXISTS extracted jsonb NOT NULL DEFAULT '{}';

-- The status view asks for pages stored in the last minute, on every refresh.
CREATE INDEX IF NOT EXISTS pages_fetched_at ON pages (fetched_at);

-- On a recrawl (--recrawl-of), whether a page's visible text matches the earlier run's.
ALTER TABLE pages ADD COLUMN IF NOT EXISTS unchanged boolean;
-- With WARC_DIR set: where the page's WARC record is (docs/WARC.md), the gzip member of its
-- response or revisit record in a worker's file.
ALTER TABLE pages ADD COLUMN IF NOT EXISTS warc_filename text;
ALTER TABLE pages ADD COLUMN IF NOT EXISTS warc_offset bigint;
ALTER TABLE pages ADD COLUMN IF NOT EXISTS warc_length bigint;
-- dead_letters.state: dead | replayed | superseded (a later copy of the URL was stored).
-- Applied once per version of this file (table schema_applied, shared/postgres/db.py).

-- A page's text is compressed as it is stored; lz4 takes a third of pglz's CPU for the same
-- job (measured on the benchmark's 6 kB pages). Rows already stored keep what they were
-- written with. A server built without lz4 keeps pglz. (SET COMPRESSION: PostgreSQL 14 on.)
DO $$
BEGIN
    ALTER TABLE pages ALTER COLUMN body_text SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    NULL;
END
$$;

-- A dead letter's body is kept whole only up to the size a task can have; of a longer one (a
-- hostile or broken message) an excerpt is kept, with the size and sha256 of the whole.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS body_bytes bigint;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS body_sha256 text;

-- Per-run counters, so that a run's figures cost the same at a million pages as at ten: kept by
-- triggers in the transaction that writes the row, whichever writer it is (the worker's store,
-- the dead-letter consumer, a replay, a purge, a cancel, an operator's own SQL). Triggers
-- rather than counting in each writer's statement: there are seven writers, and one missed
-- would make the figures drift for good. Each counted row adds to its run's counter row of the
-- writing server process (`writer`, the backend's pid): no two transactions in progress ever
-- update the same counter row, so concurrent workers neither wait for each other nor deadlock
-- on a hot row. A run's figure is the sum of its rows (one per writer process and reason).
-- An upsert that rewrites a row with the same counted values fires nothing (the WHEN of each
-- UPDATE trigger), so a redelivered URL is counted once.
--   kind page:     n pages; from_cache, after_retry (failed_attempts > 0), retries (sum of
--                  failed_attempts), rewritten (writes > 1)
--   kind dead:     n dead letters in state 'dead' of `reason`; retries = sum(attempts - 1)
--   kind replayed: n dead letters in state 'replayed' of `reason`
--   kind skip:     n skips of `reason`
-- first_at and last_at are the earliest and latest commit-time column of a counted row
-- (fetched_at, last_failed_at, recorded_at): the runs list orders by last_at, a young run's
-- pages/s is taken over the time since first_at.
-- Rows are counted one by one as they are written (a worker's batch is at most a few hundred),
-- but deletions of pages and dead letters statement by statement: a purge deletes 100,000 dead
-- letters in one statement, and PostgreSQL updating one row 100,000 times in a transaction
-- walks ever longer version chains (50,000 updates took 18 s here).
CREATE TABLE IF NOT EXISTS run_counters (
    run_id      text        NOT NULL,
    kind        text        NOT NULL,
    reason      text        NOT NULL DEFAULT '',
    writer      integer     NOT NULL,
    n           bigint      NOT NULL DEFAULT 0,
    from_cache  bigint      NOT NULL DEFAULT 0,
    after_retry bigint      NOT NULL DEFAULT 0,
    retries     bigint      NOT NULL DEFAULT 0,
    rewritten   bigint      NOT NULL DEFAULT 0,
    first_at    timestamptz,
    last_at     timestamptz,
    PRIMARY KEY (run_id, kind, reason, writer)
-- Every counted row leaves a dead version of its counter row behind: room on each page for the
-- next version (an update in place, no index entry), and a vacuum after every 1,000 of them
-- rather than after 20% of a table this small, or reading the counters slows with the crawl.
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000);
-- The writer's latest 10 s of the run's timeline for this kind and reason, and what the last
-- upsert handed on to run_timeline (run_count below).
ALTER TABLE run_counters ADD COLUMN IF NOT EXISTS open_bucket timestamptz;
ALTER TABLE run_counters ADD COLUMN IF NOT EXISTS open_n bigint NOT NULL DEFAULT 0;
ALTER TABLE run_counters ADD COLUMN IF NOT EXISTS spilled_bucket timestamptz;
ALTER TABLE run_counters ADD COLUMN IF NOT EXISTS spilled_n bigint;

-- A run's outcomes per 10 s of commit time (the dashboard's timeline), kept by the same
-- triggers as run_counters and in the same transaction, so that drawing the last 15 minutes
-- reads at most 90 buckets a writer instead of every row stored meanwhile (125,000 at 140
-- pages/s). A ring of 360 slots (one hour) for each run, kind and writer: a slot holds the
-- latest 10 s that fell in it, and one written again an hour later starts over, so the table
-- never grows with a run's length and nothing has to delete old buckets. Rows older than
-- TIMELINE_KEPT are not counted: their slot may already hold a later bucket. Kinds as in
-- run_counters: page (stored, by fetched_at), dead (state 'dead', by last_failed_at), skip (by
-- recorded_at). A bucket's figure is the sum over its writers, here and in the open buckets of
-- run_counters: each writer's latest 10 s is counted there, and reaches this table only when a
-- later one takes its place (run_count).
CREATE TABLE IF NOT EXISTS run_timeline (
    run_id text        NOT NULL,
    kind   text        NOT NULL,
    writer integer     NOT NULL,
    slot   integer     NOT NULL,
    bucket timestamptz NOT NULL,
    n      bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, kind, writer, slot)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000);
-- The timeline reads one run's latest buckets; a slot's bucket changes once per 10 s, the other
-- updates leave this index alone (and stay HOT).
CREATE INDEX IF NOT EXISTS run_timeline_recent ON run_timeline (run_id, bucket);

CREATE OR REPLACE FUNCTION run_timeline_add(p_run text, p_kind text, p_at timestamptz, p_n bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b timestamptz;
BEGIN
    IF p_at IS NULL OR p_at <= now() - interval '50 minutes' THEN  -- TIMELINE_KEPT
        RETURN;
    END IF;
    b := date_bin('10 seconds', p_at, timestamptz 'epoch');
    INSERT INTO run_timeline AS t (run_id, kind, writer, slot, bucket, n)
    VALUES (p_run, p_kind, pg_backend_pid(), (extract(epoch FROM b)::bigint / 10 % 360)::int, b, p_n)
    ON CONFLICT (run_id, kind, writer, slot) DO UPDATE SET
        n = CASE WHEN t.bucket = EXCLUDED.bucket THEN t.n + EXCLUDED.n
                 WHEN t.bucket < EXCLUDED.bucket THEN EXCLUDED.n ELSE t.n END,
        bucket = GREATEST(t.bucket, EXCLUDED.bucket);
END
$$;

-- A counted row's change to its run's counters, and to the timeline at `p_moved_at` by `p_moved`
-- (NULL when the timeline does not move: a kind without one, a change that keeps the row's
-- commit time). One upsert a counted row: the counter row keeps its writer's latest 10 s of the
-- timeline (open_bucket, open_n), which the timeline reads beside run_timeline, and only what
-- that bucket gives way to (once per 10 s), or a change to an earlier bucket, goes on to
-- run_timeline. Two upserts a stored page, counters and timeline, cost PostgreSQL about 100 us
-- of CPU a page here (one-row commits), against 40 us for the page's own insert; this one 73 us.
-- spilled_bucket and spilled_n say what the last upsert handed on (NULL when nothing): RETURNING
-- gives only the row's new values, so the bucket given way to is kept in the row to be read back.
CREATE OR REPLACE FUNCTION run_count(
    p_run text, p_kind text, p_reason text, p_n bigint, p_from_cache bigint, p_after_retry bigint,
    p_retries bigint, p_rewritten bigint, p_at timestamptz, p_moved_at timestamptz, p_moved bigint
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b timestamptz;
    spilled_bucket timestamptz;
    spilled_n bigint;
BEGIN
    IF p_moved_at > now() - interval '50 minutes' AND p_moved <> 0 THEN  -- TIMELINE_KEPT
        b := date_bin('10 seconds', p_moved_at, timestamptz 'epoch');
    END IF;
    INSERT INTO run_counters AS c (run_id, kind, reason, writer, n, from_cache, after_retry,
                                   retries, rewritten, first_at, last_at, open_bucket, open_n)
    VALUES (p_run, p_kind, p_reason, pg_backend_pid(), p_n, p_from_cache, p_after_retry,
            p_retries, p_rewritten, p_at, p_at, b, CASE WHEN b IS NULL THEN 0 ELSE p_moved END)
    ON CONFLICT (run_id, kind, reason, writer) DO UPDATE SET
        n = c.n + EXCLUDED.n, from_cache = c.from_cache + EXCLUDED.from_cache,
        after_retry = c.after_retry + EXCLUDED.after_retry, retries = c.retries + EXCLUDED.retries,
        rewritten = c.rewritten + EXCLUDED.rewritten,
        first_at = LEAST(c.first_at, EXCLUDED.first_at),
        last_at = GREATEST(c.last_at, EXCLUDED.last_at),
        -- The same bucket adds up; a later one takes the row's place and hands the row's on; an
        -- earlier one is handed on itself. GREATEST skips NULLs: a row without a bucket yet.
        open_bucket = GREATEST(c.open_bucket, EXCLUDED.open_bucket),
        open_n = CASE WHEN EXCLUDED.open_bucket IS NULL OR EXCLUDED.open_bucket < c.open_bucket THEN c.open_n
                      WHEN EXCLUDED.open_bucket = c.open_bucket THEN c.open_n + EXCLUDED.open_n
                      ELSE EXCLUDED.open_n END,
        spilled_bucket = CASE WHEN EXCLUDED.open_bucket < c.open_bucket THEN EXCLUDED.open_bucket
                              WHEN EXCLUDED.open_bucket > c.open_bucket THEN c.open_bucket END,
        spilled_n = CASE WHEN EXCLUDED.open_bucket < c.open_bucket THEN EXCLUDED.open_n
                         WHEN EXCLUDED.open_bucket > c.open_bucket THEN c.open_n END
    RETURNING c.spilled_bucket, c.spilled_n INTO spilled_bucket, spilled_n;
    IF spilled_n <> 0 THEN
        PERFORM run_timeline_add(p_run, p_kind, spilled_bucket, spilled_n);
    END IF;
END
$$;

-- The page triggers' row form, which the blocks below create on a database that had no
-- counters or no timeline yet, before the statement form takes their place (at the end).
CREATE OR REPLACE FUNCTION run_counters_page() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.run_id = NEW.run_id THEN
        -- A redelivery's rewrite moves the page to the 10 s it was written again in.
        IF OLD.fetched_at IS DISTINCT FROM NEW.fetched_at THEN
            PERFORM run_timeline_add(OLD.run_id, 'page', OLD.fetched_at, -1);
        END IF;
        PERFORM run_count(NEW.run_id, 'page', '', 0,
            NEW.from_cache::int - OLD.from_cache::int,
            (NEW.failed_attempts > 0)::int - (OLD.failed_attempts > 0)::int,
            NEW.failed_attempts::bigint - OLD.failed_attempts,
            (NEW.writes > 1)::int - (OLD.writes > 1)::int, NEW.fetched_at,
            CASE WHEN OLD.fetched_at IS DISTINCT FROM NEW.fetched_at THEN NEW.fetched_at END, 1);
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        PERFORM run_count(OLD.run_id, 'page', '', -1, -(OLD.from_cache::int),
            -((OLD.failed_attempts > 0)::int), -(OLD.failed_attempts::bigint),
            -((OLD.writes > 1)::int), NULL, OLD.fetched_at, -1);
    END IF;
    PERFORM run_count(NEW.run_id, 'page', '', 1, NEW.from_cache::int,
        (NEW.failed_attempts > 0)::int, NEW.failed_attempts, (NEW.writes > 1)::int, NEW.fetched_at,
        NEW.fetched_at, 1);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION run_counters_pages_deleted() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO run_counters AS c (run_id, kind, reason, writer, n, from_cache, after_retry,
                                   retries, rewritten)
    SELECT run_id, 'page', '', pg_backend_pid(), -count(*), -count(*) FILTER (WHERE from_cache),
           -count(*) FILTER (WHERE failed_attempts > 0), -coalesce(sum(failed_attempts), 0),
           -count(*) FILTER (WHERE writes > 1)
    FROM gone GROUP BY run_id
    ON CONFLICT (run_id, kind, reason, writer) DO UPDATE SET
        n = c.n + EXCLUDED.n, from_cache = c.from_cache + EXCLUDED.from_cache,
        after_retry = c.after_retry + EXCLUDED.after_retry, retries = c.retries + EXCLUDED.retries,
        rewritten = c.rewritten + EXCLUDED.rewritten;
    -- Within TIMELINE_KEPT, two buckets of a run never share a slot: one row each.
    INSERT INTO run_timeline AS t (run_id, kind, writer, slot, bucket, n)
    SELECT run_id, 'page', pg_backend_pid(), (extract(epoch FROM b)::bigint / 10 % 360)::int, b, -count(*)
    FROM (SELECT run_id, date_bin('10 seconds', fetched_at, timestamptz 'epoch') AS b FROM gone
          WHERE fetched_at > now() - interval '50 minutes') AS recent
    GROUP BY run_id, b
    ON CONFLICT (run_id, kind, writer, slot) DO UPDATE SET
        n = CASE WHEN t.bucket = EXCLUDED.bucket THEN t.n + EXCLUDED.n
                 WHEN t.bucket < EXCLUDED.bucket THEN EXCLUDED.n ELSE t.n END,
        bucket = GREATEST(t.bucket, EXCLUDED.bucket);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION run_counters_dead_letter() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state IN ('dead', 'replayed') THEN
        PERFORM run_count(OLD.run_id, OLD.state, OLD.reason, -1, 0, 0,
            CASE WHEN OLD.state = 'dead' THEN -GREATEST(OLD.attempts - 1, 0) ELSE 0 END, 0, NULL,
            CASE WHEN OLD.state = 'dead' THEN OLD.last_failed_at END, -1);
    END IF;
    IF NEW.state IN ('dead', 'replayed') THEN
        PERFORM run_count(NEW.run_id, NEW.state, NEW.reason, 1, 0, 0,
            CASE WHEN NEW.state = 'dead' THEN GREATEST(NEW.attempts - 1, 0) ELSE 0 END, 0,
            NEW.last_failed_at, CASE WHEN NEW.state = 'dead' THEN NEW.last_failed_at END, 1);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION run_counters_dead_letters_deleted() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO run_counters AS c (run_id, kind, reason, writer, n, retries)
    SELECT run_id, state, reason, pg_backend_pid(), -count(*),
           CASE WHEN state = 'dead' THEN -coalesce(sum(GREATEST(attempts - 1, 0)), 0) ELSE 0 END
    FROM gone WHERE state IN ('dead', 'replayed') GROUP BY run_id, state, reason
    ON CONFLICT (run_id, kind, reason, writer) DO UPDATE SET
        n = c.n + EXCLUDED.n, retries = c.retries + EXCLUDED.retries;
    INSERT INTO run_timeline AS t (run_id, kind, writer, slot, bucket, n)
    SELECT run_id, 'dead', pg_backend_pid(), (extract(epoch FROM b)::bigint / 10 % 360)::int, b, -count(*)
    FROM (SELECT run_id, date_bin('10 seconds', last_failed_at, timestamptz 'epoch') AS b FROM gone
          WHERE state = 'dead' AND last_failed_at > now() - interval '50 minutes') AS recent
    GROUP BY run_id, b
    ON CONFLICT (run_id, kind, writer, slot) DO UPDATE SET
        n = CASE WHEN t.bucket = EXCLUDED.bucket THEN t.n + EXCLUDED.n
                 WHEN t.bucket < EXCLUDED.bucket THEN EXCLUDED.n ELSE t.n END,
        bucket = GREATEST(t.bucket, EXCLUDED.bucket);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION run_counters_skip() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM run_count(OLD.run_id, 'skip', OLD.reason, -1, 0, 0, 0, 0, NULL, OLD.recorded_at, -1);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM run_count(NEW.run_id, 'skip', NEW.reason, 1, 0, 0, 0, 0, NEW.recorded_at,
            NEW.recorded_at, 1);
    END IF;
    RETURN NULL;
END
$$;

-- The helper the counters used before their rows kept an open bucket.
DROP FUNCTION IF EXISTS run_counters_add(text, text, text, bigint, bigint, bigint, bigint, bigint, timestamptz);

CREATE OR REPLACE FUNCTION run_counters_truncated() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM run_counters WHERE kind = ANY (TG_ARGV);
    DELETE FROM run_timeline WHERE kind = ANY (TG_ARGV);
    RETURN NULL;
END
$$;

-- The triggers, and the counters of the rows already there, in one transaction that holds the
-- three tables against writes: a row committed before it is in the backfill, one after it is
-- counted by its trigger, none by both. Done once: later starts find the triggers and take no
-- lock. On a large database the backfill takes a while (one pass over each table), once.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'pages'::regclass AND tgname = 'pages_counted') THEN
        RETURN;
    END IF;
    LOCK TABLE pages, dead_letters, skips IN SHARE ROW EXCLUSIVE MODE;
    CREATE TRIGGER pages_counted AFTER INSERT ON pages
        FOR EACH ROW EXECUTE FUNCTION run_counters_page();
    CREATE TRIGGER pages_counted_update AFTER UPDATE ON pages FOR EACH ROW
        WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.from_cache IS DISTINCT FROM NEW.from_cache
              OR OLD.failed_attempts IS DISTINCT FROM NEW.failed_attempts
              OR (OLD.writes > 1) IS DISTINCT FROM (NEW.writes > 1))
        EXECUTE FUNCTION run_counters_page();
    CREATE TRIGGER pages_counted_delete AFTER DELETE ON pages REFERENCING OLD TABLE AS gone
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_pages_deleted();
    CREATE TRIGGER pages_counted_truncate AFTER TRUNCATE ON pages
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_truncated('page');
    CREATE TRIGGER dead_letters_counted AFTER INSERT ON dead_letters
        FOR EACH ROW EXECUTE FUNCTION run_counters_dead_letter();
    CREATE TRIGGER dead_letters_counted_update AFTER UPDATE ON dead_letters FOR EACH ROW
        WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.state IS DISTINCT FROM NEW.state
              OR OLD.reason IS DISTINCT FROM NEW.reason OR OLD.attempts IS DISTINCT FROM NEW.attempts)
        EXECUTE FUNCTION run_counters_dead_letter();
    CREATE TRIGGER dead_letters_counted_delete AFTER DELETE ON dead_letters
        REFERENCING OLD TABLE AS gone
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_dead_letters_deleted();
    CREATE TRIGGER dead_letters_counted_truncate AFTER TRUNCATE ON dead_letters
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_truncated('dead', 'replayed');
    CREATE TRIGGER skips_counted AFTER INSERT OR DELETE ON skips
        FOR EACH ROW EXECUTE FUNCTION run_counters_skip();
    CREATE TRIGGER skips_counted_update AFTER UPDATE ON skips FOR EACH ROW
        WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.reason IS DISTINCT FROM NEW.reason)
        EXECUTE FUNCTION run_counters_skip();
    CREATE TRIGGER skips_counted_truncate AFTER TRUNCATE ON skips
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_truncated('skip');
    DELETE FROM run_counters;
    INSERT INTO run_counters (run_id, kind, reason, writer, n, from_cache, after_retry, retries,
                              rewritten, first_at, last_at)
    SELECT run_id, 'page', '', 0, count(*), count(*) FILTER (WHERE from_cache),
           count(*) FILTER (WHERE failed_attempts > 0), coalesce(sum(failed_attempts), 0),
           count(*) FILTER (WHERE writes > 1), min(fetched_at), max(fetched_at)
    FROM pages GROUP BY run_id;
    INSERT INTO run_counters (run_id, kind, reason, writer, n, retries, first_at, last_at)
    SELECT run_id, state, reason, 0, count(*),
           CASE WHEN state = 'dead' THEN coalesce(sum(GREATEST(attempts - 1, 0)), 0) ELSE 0 END,
           min(last_failed_at), max(last_failed_at)
    FROM dead_letters WHERE state IN ('dead', 'replayed') GROUP BY run_id, state, reason;
    INSERT INTO run_counters (run_id, kind, reason, writer, n, first_at, last_at)
    SELECT run_id, 'skip', reason, 0, count(*), min(recorded_at), max(recorded_at)
    FROM skips GROUP BY run_id, reason;
END
$$;

-- A run's pages/s from any machine (ops/run_progress.py) counts the outcomes committed in the
-- last half minute: pages have pages_fetched_at; dead letters and skips are few, and these
-- indexes keep that count from reading all of a run's rows.
CREATE INDEX IF NOT EXISTS dead_letters_last_failed_at ON dead_letters (last_failed_at);
CREATE INDEX IF NOT EXISTS skips_recorded_at ON skips (recorded_at);

-- The timeline's buckets (run_timeline), from the rows already there, and update triggers that
-- also fire when a row's commit time moves (a redelivered page written again, a URL that died
-- again, a skip recorded again), so that its bucket moves with it. Done once, as the counters
-- above were, in one transaction holding the three tables against writes: the functions count
-- into run_timeline from the moment they were replaced, and this recount replaces whatever they
-- counted meanwhile. Rows older than TIMELINE_KEPT are not counted, so it reads only the last
-- 50 minutes of each table (the time indexes).
DO $$
BEGIN
    -- A statement trigger (below) counts commit times by itself: this was done before it came.
    IF (SELECT tgtype & 1 = 0 OR pg_get_triggerdef(oid) LIKE '%fetched_at%' FROM pg_trigger
        WHERE tgrelid = 'pages'::regclass AND tgname = 'pages_counted_update') THEN
        RETURN;
    END IF;
    LOCK TABLE pages, dead_letters, skips IN SHARE ROW EXCLUSIVE MODE;
    DROP TRIGGER IF EXISTS pages_counted_update ON pages;
    CREATE TRIGGER pages_counted_update AFTER UPDATE ON pages FOR EACH ROW
        WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.from_cache IS DISTINCT FROM NEW.from_cache
              OR OLD.failed_attempts IS DISTINCT FROM NEW.failed_attempts
              OR (OLD.writes > 1) IS DISTINCT FROM (NEW.writes > 1)
              OR OLD.fetched_at IS DISTINCT FROM NEW.fetched_at)
        EXECUTE FUNCTION run_counters_page();
    DROP TRIGGER IF EXISTS dead_letters_counted_update ON dead_letters;
    CREATE TRIGGER dead_letters_counted_update AFTER UPDATE ON dead_letters FOR EACH ROW
        WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.state IS DISTINCT FROM NEW.state
              OR OLD.reason IS DISTINCT FROM NEW.reason OR OLD.attempts IS DISTINCT FROM NEW.attempts
              OR OLD.last_failed_at IS DISTINCT FROM NEW.last_failed_at)
        EXECUTE FUNCTION run_counters_dead_letter();
    DROP TRIGGER IF EXISTS skips_counted_update ON skips;
    CREATE TRIGGER skips_counted_update AFTER UPDATE ON skips FOR EACH ROW
        WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id OR OLD.reason IS DISTINCT FROM NEW.reason
              OR OLD.recorded_at IS DISTINCT FROM NEW.recorded_at)
        EXECUTE FUNCTION run_counters_skip();
    UPDATE run_counters SET open_bucket = NULL, open_n = 0 WHERE open_bucket IS NOT NULL;
    DELETE FROM run_timeline;
    INSERT INTO run_timeline (run_id, kind, writer, slot, bucket, n)
    SELECT run_id, kind, 0, (extract(epoch FROM b)::bigint / 10 % 360)::int, b, count(*)
    FROM (SELECT run_id, 'page' AS kind, date_bin('10 seconds', fetched_at, timestamptz 'epoch') AS b
          FROM pages WHERE fetched_at > now() - interval '50 minutes'
          UNION ALL
          SELECT run_id, 'dead', date_bin('10 seconds', last_failed_at, timestamptz 'epoch')
          FROM dead_letters WHERE state = 'dead' AND last_failed_at > now() - interval '50 minutes'
          UNION ALL
          SELECT run_id, 'skip', date_bin('10 seconds', recorded_at, timestamptz 'epoch')
          FROM skips WHERE recorded_at > now() - interval '50 minutes') AS recent
    GROUP BY run_id, kind, b;
END
$$;

-- A stored page is counted a statement at a time: the worker's writer stores a batch's pages in
-- one statement (worker/store/rows.py STORE_PAGES), so one counter upsert a batch instead of one
-- a row. A statement's changes are what its rows became (`written`) less what they were
-- (`replaced`, for an update), summed by run and commit time: an update that changes nothing
-- counted sums to nothing and is not counted, a redelivery's rewrite moves its page from the
-- old commit time's bucket to now's, a page moved to another run leaves the first. Commit times
-- in order, so that each writer's open bucket (run_count) only moves forward.
CREATE OR REPLACE FUNCTION run_counters_pages_written() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    g record;
BEGIN
    -- An upsert fires both triggers, and mostly only one of them has rows: the other's whole
    -- work is this look.
    IF TG_OP = 'INSERT' THEN
        IF NOT EXISTS (SELECT FROM written) THEN
            RETURN NULL;
        END IF;
        FOR g IN
            SELECT run_id, fetched_at, count(*) AS n, count(*) FILTER (WHERE from_cache) AS from_cache,
                   count(*) FILTER (WHERE failed_attempts > 0) AS after_retry,
                   coalesce(sum(failed_attempts), 0) AS retries,
                   count(*) FILTER (WHERE writes > 1) AS rewritten
            FROM written GROUP BY run_id, fetched_at ORDER BY fetched_at
        LOOP
            PERFORM run_count(g.run_id, 'page', '', g.n, g.from_cache, g.after_retry, g.retries,
                              g.rewritten, g.fetched_at, g.fetched_at, g.n);
        END LOOP;
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM replaced) THEN
        RETURN NULL;
    END IF;
    FOR g IN
        SELECT * FROM (
            SELECT run_id, fetched_at, sum(sign) AS n, sum(sign * from_cache::int) AS from_cache,
                   sum(sign * (failed_attempts > 0)::int) AS after_retry,
                   sum(sign * failed_attempts) AS retries, sum(sign * (writes > 1)::int) AS rewritten
            FROM (SELECT 1 AS sign, run_id, fetched_at, from_cache, failed_attempts, writes FROM written
                  UNION ALL
                  SELECT -1, run_id, fetched_at, from_cache, failed_attempts, writes FROM replaced) AS change
            GROUP BY run_id, fetched_at) AS summed
        WHERE (n, from_cache, after_retry, retries, rewritten) <> (0, 0, 0, 0, 0)
        ORDER BY fetched_at
    LOOP
        PERFORM run_count(g.run_id, 'page', '', g.n, g.from_cache, g.after_retry, g.retries,
                          g.rewritten, g.fetched_at, g.fetched_at, g.n);
    END LOOP;
    RETURN NULL;
END
$$;

-- The page triggers made statement triggers, once, holding the table against writes while the
-- row triggers give way to them: a row is counted by exactly one of the two. The counters stay
-- as they are: both count the same.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'pages'::regclass
                   AND tgname IN ('pages_counted', 'pages_counted_update') AND tgtype & 1 = 1) THEN
        RETURN;  -- bit 1 of tgtype: a row trigger
    END IF;
    LOCK TABLE pages IN SHARE ROW EXCLUSIVE MODE;
    DROP TRIGGER IF EXISTS pages_counted ON pages;
    DROP TRIGGER IF EXISTS pages_counted_update ON pages;
    CREATE TRIGGER pages_counted AFTER INSERT ON pages REFERENCING NEW TABLE AS written
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_pages_written();
    CREATE TRIGGER pages_counted_update AFTER UPDATE ON pages
        REFERENCING OLD TABLE AS replaced NEW TABLE AS written
        FOR EACH STATEMENT EXECUTE FUNCTION run_counters_pages_written();
END
$$;
