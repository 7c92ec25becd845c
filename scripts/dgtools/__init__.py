"""dgtools: the Python behind scripts/ (the benches, the test summary). Each shell entry point in
scripts/ checks and installs what it needs, then runs one module here with
PYTHONPATH=scripts python3 -m dgtools.<module>; the modules never build or install anything."""
