"""Pure functions over recorded measurements."""
