"""One-off diagnostics behind the bench's numbers (not table rows): each runs as `python -m benchmarks.diagnostics.NAME`."""
