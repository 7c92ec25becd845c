"""scripts/bench: the papers' measurements and the results page. ctx holds the run's state (options,
paths, failures, ports); one module per section (verbs: 1 and 2, sock: 3, vlc: 4, sipp: 5), procs
for the programs measured, page for results.md; the figures are in dgtools.plots."""
