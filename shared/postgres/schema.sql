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
