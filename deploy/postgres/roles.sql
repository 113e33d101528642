-- memworker's Postgres roles: one that owns the schema (migrations) and one the consolidator
-- runs as, with only the privileges it needs.
--
--   memworker_owner    owns schema `memworker` and every table in it; `memworker migrate` runs
--                      as this role. Not a superuser, cannot create roles or databases.
--   memworker_runtime  `memworker consolidate` (and the long-term memory API) run as this role:
--                      SELECT, INSERT, DELETE (forget) on lifecycle_events and episodes,
--                      UPDATE of episodes.announced_at only (the outbox flag), SELECT and
--                      INSERT on erasures (forget's record; UPDATE of its counts), SELECT on
--                      alembic_version. It cannot CREATE, ALTER, DROP or TRUNCATE anything.
--
-- Run as a superuser (or a role with CREATEROLE that is a member of memworker_owner), connected
-- to memworker's database. The script is idempotent and must run twice per deployment:
--   1. before the first `memworker migrate`: it creates the roles and the schema;
--   2. after every `memworker migrate`: it grants the runtime role its privileges on the tables
--      the migrations created (tables that do not exist yet are skipped).
-- The compose file and the Kubernetes migrate Job do exactly that.
--
-- Passwords are taken from two settings when they are set, and left as they are otherwise
-- (certificate or IAM authentication needs none):
--   PGOPTIONS='-c memworker.owner_password=… -c memworker.runtime_password=…' \
--     psql -v ON_ERROR_STOP=1 -d memworker -f roles.sql
-- (or `SET memworker.owner_password = '…'` in the same session before running the file).
-- They are read with current_setting(), so they never appear in the statement text or its logs.

SET client_min_messages = warning;

DO $roles$
DECLARE
  owner_password text := nullif(current_setting('memworker.owner_password', true), '');
  runtime_password text := nullif(current_setting('memworker.runtime_password', true), '');
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memworker_owner') THEN
    CREATE ROLE memworker_owner LOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memworker_runtime') THEN
    CREATE ROLE memworker_runtime LOGIN;
  END IF;
  ALTER ROLE memworker_owner NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
  ALTER ROLE memworker_runtime NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
  IF owner_password IS NOT NULL THEN
    EXECUTE format('ALTER ROLE memworker_owner PASSWORD %L', owner_password);
  END IF;
  IF runtime_password IS NOT NULL THEN
    EXECUTE format('ALTER ROLE memworker_runtime PASSWORD %L', runtime_password);
  END IF;

  -- Both roles find memworker's tables (and Alembic's version table) in schema memworker.
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO memworker_owner, memworker_runtime',
                 current_database());
  EXECUTE format('ALTER ROLE memworker_owner IN DATABASE %I SET search_path = memworker',
                 current_database());
  EXECUTE format('ALTER ROLE memworker_runtime IN DATABASE %I SET search_path = memworker',
                 current_database());
END
$roles$;

CREATE SCHEMA IF NOT EXISTS memworker AUTHORIZATION memworker_owner;
ALTER SCHEMA memworker OWNER TO memworker_owner;
REVOKE ALL ON SCHEMA memworker FROM PUBLIC;
GRANT USAGE ON SCHEMA memworker TO memworker_runtime;
-- Nobody but the owner creates objects: the runtime role gets no CREATE anywhere. (PostgreSQL 15
-- and later already revoke CREATE on schema public from PUBLIC; older ones do not.)
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- Table privileges, on the tables that exist (run again after each migration). REVOKE ALL
-- first, so a privilege removed here is removed from a database set up by an older version.
DO $grants$
BEGIN
  IF to_regclass('memworker.lifecycle_events') IS NOT NULL THEN
    REVOKE ALL ON memworker.lifecycle_events FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.lifecycle_events TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.episodes') IS NOT NULL THEN
    REVOKE ALL ON memworker.episodes FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.episodes TO memworker_runtime;
    GRANT UPDATE (announced_at) ON memworker.episodes TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.erasures') IS NOT NULL THEN
    REVOKE ALL ON memworker.erasures FROM memworker_runtime;
    GRANT SELECT, INSERT ON memworker.erasures TO memworker_runtime;
    GRANT UPDATE (counts) ON memworker.erasures TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.alembic_version') IS NOT NULL THEN
    REVOKE ALL ON memworker.alembic_version FROM memworker_runtime;
    GRANT SELECT ON memworker.alembic_version TO memworker_runtime;
  END IF;
END
$grants$;
