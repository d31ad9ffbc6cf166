"""A fresh process of tests/test_structure.py: what importing the library does. Imports diffrax, equinox,
jax and optimistix (sciad's dependencies), records the loggers, JAX's config and the warning filters,
imports sciad, sciad.problems and sciad.select, and prints one JSON object:

    {"benchmark_packages": the benchmark product's packages now imported,
     "changed_loggers": the loggers whose settings the import changed (new ones counted as fresh),
     "config_and_filters_unchanged": whether JAX's config and the warning filters are as they were}

    python tests/programs/import_sciad.py
"""

import json
import logging
import sys
import warnings

import diffrax  # noqa: F401
import equinox  # noqa: F401
import jax
import optimistix  # noqa: F401

BENCHMARK_PACKAGES = ("matplotlib", "scipy", "optax", "torchdiffeq", "sciad_bench")


def state():
    loggers = {
        name: logger for name, logger in logging.root.manager.loggerDict.items() if isinstance(logger, logging.Logger)
    } | {"(root)": logging.root}
    return (
        {
            name: (logger.level, logger.propagate, logger.disabled, list(logger.handlers), list(logger.filters))
            for name, logger in loggers.items()
        },
        dict(jax.config.values),
        list(warnings.filters),
    )


def main():
    before = state()
    import sciad  # noqa: F401
    import sciad._select  # noqa: F401
    import sciad.problems  # noqa: F401

    after = state()
    fresh = (logging.NOTSET, True, False, [], [])
    print(
        json.dumps(
            {
                "benchmark_packages": sorted(m for m in BENCHMARK_PACKAGES if m in sys.modules),
                "changed_loggers": [name for name, got in after[0].items() if got != before[0].get(name, fresh)],
                "config_and_filters_unchanged": after[1:] == before[1:],
            }
        )
    )


if __name__ == "__main__":
    main()
