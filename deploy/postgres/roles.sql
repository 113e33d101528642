-- memworker's Postgres roles: one that owns the schema (migrations) and one the consolidator
-- runs as, with only the privileges it needs.
--
--   memworker_owner    owns schema `memworker` and every table in it; `memworker migrate` runs
--                      as this role. Not a superuser, cannot create roles or databases.
--   memworker_runtime  `memworker consolidate`, `memworker index` and the memory API
--                      (`memworker serve`, forget, export) run as this role: SELECT, INSERT,
--                      DELETE (forget) on lifecycle_events, episodes, episode_embeddings (and a long output's
--                      chunk vectors, episode_chunk_embeddings: replaced by DELETE + INSERT),
--                      memory_blocks, facts and memory_changes; UPDATE of the columns they
--                      change: episodes.announced_at and consolidated_at (the outbox flag, the
--                      extractor's mark), a vector's model/dimension/embedding/embedded_at
--                      (the indexer's upsert), a block's content/pinned_order/updated_at, a
--                      fact's validity, sources and vector; SELECT and INSERT on erasures
--                      (forget's record; UPDATE of its counts and completed_at: an owed
--                      forget finished), SELECT on alembic_version.
--                      It cannot CREATE, ALTER, DROP or TRUNCATE anything.
--
-- It also creates the `vector` extension (pgvector) in schema memworker when the server has it:
-- pgvector is not a trusted extension, so the owner role cannot create it (and `memworker
-- migrate` would leave recall to full-text search). Without pgvector it is skipped.
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
-- pgvector, where the server ships it: only a superuser may create it. In schema memworker, on
-- both roles' search_path, so the migration's `vector` columns and the queries find its type.
DO $vector$
BEGIN
  IF EXISTS (SELECT FROM pg_available_extensions WHERE name = 'vector') THEN
    CREATE EXTENSION IF NOT EXISTS vector SCHEMA memworker;
  END IF;
END
$vector$;
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
    GRANT UPDATE (announced_at, consolidated_at) ON memworker.episodes TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.episode_embeddings') IS NOT NULL THEN
    REVOKE ALL ON memworker.episode_embeddings FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.episode_embeddings TO memworker_runtime;
    GRANT UPDATE (model, dimension, embedding, embedded_at)
      ON memworker.episode_embeddings TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.episode_chunk_embeddings') IS NOT NULL THEN
    REVOKE ALL ON memworker.episode_chunk_embeddings FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.episode_chunk_embeddings TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.memory_blocks') IS NOT NULL THEN
    REVOKE ALL ON memworker.memory_blocks FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.memory_blocks TO memworker_runtime;
    GRANT UPDATE (content, pinned_order, updated_at) ON memworker.memory_blocks
      TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.facts') IS NOT NULL THEN
    REVOKE ALL ON memworker.facts FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.facts TO memworker_runtime;
    GRANT UPDATE (valid_from, valid_until, sources, embedding, embedding_model)
      ON memworker.facts TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.memory_changes') IS NOT NULL THEN
    REVOKE ALL ON memworker.memory_changes FROM memworker_runtime;
    GRANT SELECT, INSERT, DELETE ON memworker.memory_changes TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.erasures') IS NOT NULL THEN
    REVOKE ALL ON memworker.erasures FROM memworker_runtime;
    GRANT SELECT, INSERT ON memworker.erasures TO memworker_runtime;
    GRANT UPDATE (counts, completed_at) ON memworker.erasures TO memworker_runtime;
  END IF;
  IF to_regclass('memworker.alembic_version') IS NOT NULL THEN
    REVOKE ALL ON memworker.alembic_version FROM memworker_runtime;
    GRANT SELECT ON memworker.alembic_version TO memworker_runtime;
  END IF;
END
$grants$;
