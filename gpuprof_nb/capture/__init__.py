"""Recording a cell with torch: compiling and running cells (cell.py), timing, the
profiler and what samples beside it, memory history, device ceilings. It returns raw
recordings (trace and snapshot dicts, timings) and imports only io and model; the session
(gpuprof_nb/session) reads and analyses them.

The only package that imports torch at module level."""
