"""Test support: servers once per session and one helper per need. `fixtures` is the pytest plugin."""
