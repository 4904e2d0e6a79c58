-- Fill rules shared by every proxy reading this store: on INSERT into table_name without
-- column_name, the proxy adds column_name with an ID of tag. table_name is [schema.]table
-- and column_name a column, each name double-quoted when it is not a plain lower-case
-- identifier, as `leafproxy fill add` writes them. Proxies merge these rows with the fill
-- rules of their configuration at every rule refresh.
CREATE TABLE IF NOT EXISTS leaf_fill (
    table_name  text        NOT NULL CHECK (table_name <> ''),
    column_name text        NOT NULL CHECK (column_name <> ''),
    tag         text        NOT NULL CHECK (tag <> ''),
    update_time timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, column_name)
);
