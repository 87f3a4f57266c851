"""The SQLite database: connection and schema check, migrations, saved cases, run history, merge."""
