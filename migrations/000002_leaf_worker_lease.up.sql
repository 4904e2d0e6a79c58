-- Snowflake worker IDs leased from PostgreSQL: one row per worker ID. A holder claims the
-- lowest free or expired row, renews expires_at, and records the last millisecond it used
-- in high_water_ms so that the next holder starts only after it.
CREATE TABLE IF NOT EXISTS leaf_worker_lease (
    worker_id     integer     PRIMARY KEY CHECK (worker_id BETWEEN 0 AND 1023),
    holder        text,
    expires_at    timestamptz NOT NULL DEFAULT '-infinity',
    high_water_ms bigint      NOT NULL DEFAULT 0,
    update_time   timestamptz NOT NULL DEFAULT now()
);

INSERT INTO leaf_worker_lease (worker_id)
SELECT g FROM generate_series(0, 1023) AS g
ON CONFLICT (worker_id) DO NOTHING;
