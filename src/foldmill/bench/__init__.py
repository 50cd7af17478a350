"""Benchmarks run by `foldmill bench NAME`; each module exposes `register(subparsers)`."""
