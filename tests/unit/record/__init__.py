"""The rank record: layout, readers, bounds, fuzzing."""
