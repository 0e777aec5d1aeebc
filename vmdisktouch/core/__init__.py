"""The pure policy: numpy only. No OS, clock, image or signal module is imported here
(tests/core/test_layers.py checks it)."""
