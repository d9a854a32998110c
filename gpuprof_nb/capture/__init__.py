"""Recording a cell with torch: timing, profiler, memory history, device ceilings.

The only package that imports torch at module level."""
