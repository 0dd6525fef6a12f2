"""The SQL that records a URL skipped, run by the worker's writer (worker/store/writer.py) and by
`ops.runs cancel` for the URLs it skips itself: one statement, so both keep the same rule."""

# Every URL keeps one outcome: a copy skipped after another copy's page was stored or its dead
# letter recorded (a duplicate taken after `cancel`) adds no skip.
UPSERT_SKIP = """
INSERT INTO skips (run_id, url, reason, detail, worker_id)
SELECT %(run_id)s, %(url)s, %(reason)s, %(detail)s, %(worker_id)s
WHERE NOT EXISTS (SELECT 1 FROM pages WHERE pages.run_id = %(run_id)s AND pages.url = %(url)s)
  AND NOT EXISTS (SELECT 1 FROM dead_letters AS d
                  WHERE d.run_id = %(run_id)s AND d.url = %(url)s AND d.state = 'dead')
ON CONFLICT (run_id, url) DO UPDATE SET
    reason = EXCLUDED.reason, detail = EXCLUDED.detail, worker_id = EXCLUDED.worker_id,
    recorded_at = now()
"""
