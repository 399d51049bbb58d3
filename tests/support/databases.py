"""A template database with every service's migrations; each test gets a fast clone of it."""

import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from services.runtime.platform.postgres import apply_migrations

SERVICES_DIR = Path(__file__).resolve().parents[2] / "services"


def _url_for(server_url: str, database: str) -> str:
    return f"{server_url.rsplit('/', 1)[0]}/{database}"


def _admin(server_url: str) -> psycopg.Connection:
    return psycopg.connect(_url_for(server_url, "postgres"), autocommit=True)


def create_template(server_url: str) -> str:
    name = f"tpl_{uuid.uuid4().hex[:10]}"
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    for migrations in sorted(SERVICES_DIR.glob("*/migrations")):
        apply_migrations(_url_for(server_url, name), migrations.parent.name, migrations)
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
    return name


def create_empty(server_url: str, name: str) -> str:
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _url_for(server_url, name)


def clone(server_url: str, template: str) -> str:
    """A fresh database with the schema already in place; returns its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    return _url_for(server_url, name)


def drop(server_url: str, database_url: str) -> None:
    name = database_url.rsplit("/", 1)[1]
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def drop_template(server_url: str, template: str) -> None:
    with _admin(server_url) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(sql.Identifier(template)))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(template)))
