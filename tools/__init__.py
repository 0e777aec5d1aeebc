"""Entry points run from a checkout (``python -m tools.NAME``): ``demo``, ``cli_docs``,
``golden_replan``, ``host_example``, ``readme_pictures``. What they share with the tests and the
benchmarks is in ``tests.support``."""
