"""Postgres: the engine, the tables (episodes, their vectors, the lifecycle event log), batch
inserts and the migrations. Owns the schema; every room that stores rows goes through it."""
