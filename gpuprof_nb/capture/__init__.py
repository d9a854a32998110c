"""Recording a cell with torch: how `%%gpuprofile` runs a cell (session.py) and reads its
option line (options.py), compiling and running cells (cell.py), timing, profiler, memory
history, device ceilings.

The only package that imports torch at module level."""
