-- Leaf-segment: one row per business tag. A proxy reserves the range
-- (max_id - step, max_id] with one UPDATE ... RETURNING; step is the minimum step.
CREATE TABLE IF NOT EXISTS leaf_alloc (
    biz_tag     text        PRIMARY KEY,
    max_id      bigint      NOT NULL DEFAULT 1,
    step        integer     NOT NULL CHECK (step > 0),
    description text,
    update_time timestamptz NOT NULL DEFAULT now()
);
