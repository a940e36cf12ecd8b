#!/usr/bin/env bash
# PostgreSQL for the tests of the trace store and of `verlog serve --postgres-uri` (tests/postgres_server.py
# starts a throw-away server of its own with initdb/pg_ctl). `make test` runs this first: where no server is
# installed and this runs as root with apt-get (a fresh CI machine), Debian's `postgresql` package is
# installed. Exit 0 when initdb is there (the tests then must start it: VERLOG_REQUIRE_POSTGRES=1), 1 when
# it is not (they are skipped, saying so). VERLOG_NO_POSTGRES_INSTALL=1: never install.
set -uo pipefail

found() {
    command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

if found; then
    echo "postgres: initdb found; the PostgreSQL tests run"
    exit 0
fi
if [ "${VERLOG_NO_POSTGRES_INSTALL:-}" = "1" ]; then
    echo "postgres: not installed (VERLOG_NO_POSTGRES_INSTALL=1); the PostgreSQL tests are skipped"
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"  # a CI user with password-less sudo
fi
if { [ "$(id -u)" != "0" ] && [ -z "$SUDO" ]; } || ! command -v apt-get >/dev/null 2>&1; then
    echo "postgres: not installed, and installing needs root (or password-less sudo) and apt-get" \
         "(apt-get install postgresql); the PostgreSQL tests are skipped"
    exit 1
fi
echo "postgres: installing Debian's postgresql package ..."
if ! { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql \
        >/dev/null; }; then
    echo "postgres: apt-get install postgresql failed; the PostgreSQL tests are skipped"
    exit 1
fi
found && echo "postgres: installed; the PostgreSQL tests run"
