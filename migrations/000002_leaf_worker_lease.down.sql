DROP TABLE IF EXISTS leaf_worker_lease;
