"""Watching a running job: arming it without touching its code, reading its ranks from their nodes."""
