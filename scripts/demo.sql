-- The demo of the Quickstart, run by `make run` (scripts/run.sh) and by the `demo` service
-- of docker-compose.yml after `leafproxy migrate up`. It can run any number of times.
--
-- "audit" is a segment tag: a leaf_alloc row, the same as
--   leafproxy tag add audit --step 1000 --description "demo segment tag"
-- "order" is a snowflake tag: it lives in the proxy's configuration (snowflake-tags), not
-- here, and INSERTs into orders get their id filled with an "order" ID (fill orders.id=order).
INSERT INTO leaf_alloc (biz_tag, max_id, step, description)
VALUES ('audit', 1, 1000, 'demo segment tag')
ON CONFLICT (biz_tag) DO NOTHING;

CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, item text);
