"""The road from a front door to a report, end to end: a `%%gpuprofile` cell
(profile.py), a `%%memsnap` cell (memsnap.py), a function (functions.py), trace and snapshot
files and the reports users hold (analyze.py, files.py), a distributed run's ranks
(distributed.py) and named baselines (baselines.py).

The front doors (the magics, the command line, the pytest helper, the package's public
names) parse what they are given into frozen options and call a session; a session runs
capture, io and analysis in order and returns a typed result, which the front door
publishes. This is also the one place that reads what analysis must not: the measured
ceilings cached per machine (io/ceilings.py) and the timed samples a saved report keeps
with its trace (io/timing.py), handed to the analysis as arguments.
"""
