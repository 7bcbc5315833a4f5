-- Bucket stores (postgres). Keep in step with ../sqlite/0005_bucket.sql.
-- A store whose bucket is set (s3://BUCKET/PREFIX) publishes every version that leaves
-- maintenance to that bucket as a write-once object with its manifest; its path stays the
-- working directory where the lifecycle makes files and where maintenance versions live.
-- Empty text: a directory store.
ALTER TABLE stores ADD COLUMN bucket TEXT NOT NULL DEFAULT '';
