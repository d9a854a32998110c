"""Every result users hold, frozen and typed: findings and diagnoses, op and kernel tables,
timelines, rooflines, memory analyses, the profile and memory reports, the ladder's results.
Each displays through `results.display.Displayable`; nothing here imports the render layer.

Import the types from their modules (`gpuprof_nb.results.report.ProfileReport`) or from the
package root (`gpuprof_nb.ProfileReport`); this package imports nothing by itself, so the
package root can set the renderer without loading numpy.
"""
