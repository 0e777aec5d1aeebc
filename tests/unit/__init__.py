"""Pure tests: no kernel state, no child processes beyond quick CLI checks; milliseconds each."""
