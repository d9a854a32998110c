"""Recording a cell with torch: timing, profiler, memory history, device ceilings. The only package importing torch at module level."""
