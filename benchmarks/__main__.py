"""`python -m benchmarks [options]` from a checkout: the same run as `cacheruntime bench`."""

from __future__ import annotations

import argparse
import sys

from benchmarks import add_arguments, main

parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
add_arguments(parser)
sys.exit(main(parser.parse_args()))
