"""One check-then-time loop (the autotuner's and the benchmarks'): `compare` compiles, checks against
a reference and times candidates in interleaved rounds; `interleaved`, `timed`, `quartiles`, `ties`
and `fastest` are its parts. `SLOW_CALL` (s): calls slower than this are timed fewer times."""

from sciad._timing import SLOW_CALL, compare, fastest, interleaved, quartiles, relative_error, ties, timed

__all__ = ["SLOW_CALL", "compare", "fastest", "interleaved", "quartiles", "relative_error", "ties", "timed"]
